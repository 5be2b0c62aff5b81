"""The plan tree of a plan-mode task as the dashboard draws it (node/api/static/plans.js).

:func:`plan_view` turns a plan task's stored snapshot (protocol/agents/plan_runs.py
``plan_snapshot``: updated at every ``PlanUpdated``, so as each step completes) into the
tree the page renders: each plan's planner, state, answer and replaced planners; each step's
instruction, requirement, agent, executor, output and tool calls; and the vote over plans.
A step's tool calls are in its child task's snapshot (``load``: the tasks service's stored
snapshot of a task id), which the plan's snapshot names but does not copy. Every text a
planner or executor wrote is cut to ``SHOWN_CHARS``; the page inserts it as text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: characters of a planner's or executor's text shown
SHOWN_CHARS = 160

Load = Callable[[str], "dict[str, Any] | None"]


def _short(value: object, n: int = SHOWN_CHARS) -> str:
    text = " ".join(str(value or "").split())
    return text if len(text) <= n else text[:n - 1] + "…"


def _requirement(step: dict[str, Any]) -> str:
    req = step.get("requirement") or {}
    parts = [str(req.get("needs") or ""), " ".join(str(s) for s in req.get("skills") or [])]
    return _short(", ".join(p for p in parts if p)) or "any"


def _tool_calls(child: str, load: Load) -> list[dict[str, str]]:
    """The tool calls of a step's child task (its results' ``tool_calls``)."""
    snap = load(child) if child else None
    if snap is None:
        return []
    return [{"executor": str(r.get("executor", "")), "name": _short(c.get("name"), 60),
             "arguments": _short(json.dumps(c.get("arguments"), sort_keys=True)),
             "output": _short(c.get("output"))}
            for r in snap.get("results") or [] for c in r.get("tool_calls") or []]


def _step(n: int, step: dict[str, Any], load: Load) -> dict[str, Any]:
    child = str(step.get("task_id") or "")
    return {"n": n, "instruction": _short(step.get("instruction")),
            "requirement": _requirement(step), "agent": str(step.get("agent") or ""),
            "executor": str(step.get("executor") or ""), "output": _short(step.get("output")),
            "done": bool(step.get("done")), "tries": int(step.get("tries") or 0),
            "peers_tried": int(step.get("peers_tried") or 0), "task_id": child,
            "tool_calls": _tool_calls(child, load) if step.get("done") else []}


def plan_view(snap: dict[str, Any], load: Load) -> dict[str, Any] | None:
    """The tree of a plan task's snapshot (None: the snapshot is not a plan task's)."""
    if snap.get("mode") != "plan":
        return None
    plans = []
    for n, plan in enumerate(snap.get("plans") or [], 1):
        steps = [_step(i, s, load) for i, s in enumerate(plan.get("steps") or [], 1)]
        plans.append({
            "n": n, "planner": str(plan.get("planner") or ""), "state": str(plan.get("state")),
            "answer": _short(plan.get("answer"), 60), "failure": _short(plan.get("failure")),
            "replaced": [{"planner": str(r.get("planner") or ""), "why": _short(r.get("why"))}
                         for r in plan.get("replaced") or []],
            "steps": steps, "steps_done": sum(s["done"] for s in steps)})
    votes = [{"answer": _short(v.get("answer"), 60), "count": v.get("count"),
              "share": v.get("share"), "weight": v.get("weight"), "voters": list(v.get("voters") or [])}
             for v in snap.get("votes") or []]
    return {"plans": plans, "votes": votes, "answer": snap.get("answer"),
            "steps_done": sum(p["steps_done"] for p in plans),
            "steps_total": sum(len(p["steps"]) for p in plans)}
