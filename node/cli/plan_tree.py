"""The plan tree of a plan-mode task (``symphony tasks show``, ``symphony ask --mode plan``):
each plan's planner, its steps with who ran them and what they gave, and the replaced
planners; the votes are printed by node/cli/tasks.py as for any task."""

from __future__ import annotations

from typing import Any

from node.cli.daemon_api import short_peer, stdout_console

#: characters of a step's output shown in the tree
SHOWN_OUTPUT = 120


def _short(text: str, n: int = SHOWN_OUTPUT) -> str:
    """``text`` on one line, cut to ``n`` characters, its rich markup escaped (a planner's
    or executor's words are printed as written, never as markup)."""
    from rich.markup import escape

    text = " ".join(str(text).split())
    return escape(text if len(text) <= n else text[:n - 1] + "…")


def print_plan_tree(snap: dict[str, Any]) -> None:
    from rich.tree import Tree

    root = Tree(f"plans for: {_short(snap.get('question', ''), 80)}")
    for n, plan in enumerate(snap.get("plans") or [], 1):
        who = short_peer(plan["planner"]) if plan.get("planner") else "-"
        label = f"plan {n} by {who}: {plan['state']}"
        if plan.get("answer"):
            label += f", answer {_short(plan['answer'], 40)}"
        if plan.get("failure"):
            label += f" ({_short(plan['failure'], 80)})"
        branch = root.add(label)
        for old in plan.get("replaced") or []:
            branch.add(f"replaced planner {short_peer(old['planner']) if old['planner'] else '-'}"
                       f": {_short(old['why'], 80)}")
        for i, step in enumerate(plan.get("steps") or [], 1):
            req = step.get("requirement") or {}
            need = _short(", ".join(x for x in (req.get("needs", ""),
                                                " ".join(req.get("skills") or [])) if x))
            ran = (f"{step['agent'] or '-'} on {short_peer(step['executor'])}"
                   if step.get("executor") else "not run")
            tries = f", {step['peers_tried']} executors" if step.get("peers_tried", 0) > 1 else ""
            node = branch.add(f"step {i}: {_short(step['instruction'], 80)} "
                              f"\\[{need or 'any'}] -> {ran}{tries}")
            if step.get("output"):
                node.add(_short(step["output"]))
    stdout_console().print(root)
