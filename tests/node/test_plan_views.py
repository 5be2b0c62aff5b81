"""Seeing a plan without a network: the dashboard's plan tree (node/api/dashboard_plans.py)
built from the pipeline's own snapshot, as steps complete."""

from __future__ import annotations

from typing import Any

from node.api.dashboard_plans import SHOWN_CHARS, plan_view
from protocol.agents.plan_runs import (
    PlanSlot,
    PlanTask,
    SlotState,
    StepRun,
    SubmitPlanTask,
    plan_snapshot,
)
from protocol.agents.plans import parse_plan

TID = b"\x07" * 32
CHILD = b"\x09" * 32
PLAN = parse_plan('{"steps": [{"instruction": "add 2 and 3", "needs": "arithmetic", '
                  '"skills": ["math"]}, {"instruction": "multiply by 4", "needs": "", '
                  '"skills": []}]}')


def plan_task(done_steps: int) -> PlanTask:
    """A two-step plan with its first ``done_steps`` steps run (the second by a calculator
    agent whose child task is CHILD); answered once both are done."""
    runs = [StepRun(step=s) for s in PLAN.steps]
    if done_steps >= 1:
        runs[0] = StepRun(step=PLAN.steps[0], executor="E" * 52, agent="generalist",
                          output="2 + 3 = 5 " + "x" * 500, done=True, peers_tried=2, tries=1)
    if done_steps >= 2:
        runs[1] = StepRun(step=PLAN.steps[1], executor="F" * 52, agent="calc",
                          output="20", done=True, child=CHILD, peers_tried=1, tries=1)
    answered = done_steps == 2
    slot = PlanSlot(index=0, replans_left=0, planner="P" * 52, plan=PLAN, steps=runs,
                    state=SlotState.ANSWERED if answered else SlotState.RUNNING,
                    replaced=[{"planner": "Q" * 52, "why": "invalid plan: not JSON"}])
    spec = SubmitPlanTask(task_id=TID, question="What is (2+3)*4?", answer_type="number",
                          deadline_ms=60_000)
    return PlanTask(spec=spec, planners=1, created_at_ms=0, deadline_at_ms=60_000,
                    phase="done" if answered else "running", slots=[slot],
                    answer="20" if answered else None,
                    votes=[{"answer": "20", "weight": 0.4, "count": 1, "voters": ["0:P"],
                            "share": 1.0}] if answered else [])


def child_tasks(task_id: str) -> dict[str, Any] | None:
    """The tasks service's stored snapshot of the calculator step's child task."""
    if task_id != CHILD.hex():
        return None
    return {"task_id": task_id, "results": [{"executor": "F" * 52, "tool_calls": [
        {"name": "calculator", "arguments": {"expression": "5*4"}, "output": "20"}]}]}


def test_a_task_that_is_not_a_plan_has_no_tree() -> None:
    assert plan_view({"task_id": "ab", "mode": "task"}, child_tasks) is None
    assert plan_view({"task_id": "ab"}, child_tasks) is None


def test_the_tree_grows_as_steps_complete() -> None:
    seen = [plan_view(plan_snapshot(plan_task(n)), child_tasks) for n in (0, 1, 2)]
    assert [v["steps_done"] for v in seen if v] == [0, 1, 2]
    assert all(v is not None and v["steps_total"] == 2 for v in seen)
    first = seen[0]
    assert first is not None
    assert [s["done"] for s in first["plans"][0]["steps"]] == [False, False]
    assert first["plans"][0]["state"] == "running" and first["votes"] == []


def test_the_tree_names_steps_agents_tool_calls_and_the_vote() -> None:
    view = plan_view(plan_snapshot(plan_task(2)), child_tasks)
    assert view is not None
    plan = view["plans"][0]
    assert (plan["n"], plan["planner"], plan["state"], plan["answer"]) == (
        1, "P" * 52, "answered", "20")
    assert plan["replaced"] == [{"planner": "Q" * 52, "why": "invalid plan: not JSON"}]
    one, two = plan["steps"]
    assert (one["instruction"], one["requirement"], one["agent"], one["executor"]) == (
        "add 2 and 3", "arithmetic, math", "generalist", "E" * 52)
    assert (one["peers_tried"], one["tool_calls"], two["output"]) == (2, [], "20")
    # an executor's long output is cut for the page
    assert len(one["output"]) == SHOWN_CHARS and one["output"].startswith("2 + 3 = 5 x")
    assert two["requirement"] == "any" and two["agent"] == "calc"
    assert two["tool_calls"] == [{"executor": "F" * 52, "name": "calculator",
                                  "arguments": '{"expression": "5*4"}', "output": "20"}]
    assert view["votes"] == [{"answer": "20", "count": 1, "share": 1.0, "weight": 0.4,
                              "voters": ["0:P"]}]
    assert view["answer"] == "20"
