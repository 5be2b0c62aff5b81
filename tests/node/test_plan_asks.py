"""Plan-mode asks in the daemon without a network: the request checks (node/market/
plan_asks.py), the restart rule for an open plan task, and the plan tree the CLI draws."""

from __future__ import annotations

from typing import Any

import pytest

from node.cli.tasks import print_task
from node.market.ask_request import AskError
from node.market.plan_asks import interrupted_plan, parse_plan_ask, plan_mode
from node.market.requester import TasksSection
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


def ask(**kw: Any) -> SubmitPlanTask:
    return parse_plan_ask({"question": "What is (2+3)*4?", "mode": "plan", **kw},
                          TasksSection(), 3, TID)


def test_a_plan_ask_is_checked_like_an_ask() -> None:
    ev = ask(answer_type="number", deadline_ms=600_000, max_tokens=24, planners=2)
    assert (ev.task_id, ev.answer_type, ev.deadline_ms, ev.max_tokens, ev.planners) == (
        TID, "number", 600_000, 24, 2)
    assert ask().planners == 3 and plan_mode({"mode": "plan"}) and not plan_mode({})


@pytest.mark.parametrize(("fields", "field"), [
    ({"planners": 0}, "planners"), ({"planners": True}, "planners"),
    ({"planners": "3"}, "planners"), ({"planners": 99}, "planners"),
    ({"needs": "math"}, "mode"), ({"style": "chat"}, "mode"),
    ({"history": [{"role": "user", "content": "hi"}]}, "mode"),
    ({"deadline_ms": -5}, "deadline_ms"), ({"answer_type": "poem"}, "answer_type"),
])
def test_bad_plan_asks_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(AskError) as err:
        ask(**fields)
    assert err.value.param == field


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(AskError):
        plan_mode({"mode": "swarm"})


def snapshot() -> dict[str, Any]:
    spec = SubmitPlanTask(task_id=TID, question="What is (2+3)*4?", answer_type="number",
                          deadline_ms=60_000)
    plan = parse_plan('{"steps": [{"instruction": "add 2 and 3", "needs": "arithmetic", '
                      '"skills": ["math"]}]}')
    slot = PlanSlot(index=0, replans_left=0, state=SlotState.ANSWERED, planner="P" * 52,
                    plan=plan, steps=[StepRun(step=plan.steps[0], executor="E" * 52,
                                              agent="calc", output="5", done=True,
                                              peers_tried=2)],
                    replaced=[{"planner": "Q" * 52, "why": "invalid plan: not JSON"}])
    task = PlanTask(spec=spec, planners=1, created_at_ms=0, deadline_at_ms=60_000,
                    phase="done", slots=[slot], answer="5",
                    votes=[{"answer": "5", "weight": 0.4, "count": 1, "voters": ["0:P"],
                            "share": 1.0}])
    return plan_snapshot(task)


def test_the_plan_tree_shows_planners_steps_and_replacements(
        capsys: pytest.CaptureFixture[str]) -> None:
    print_task(snapshot(), show_cot=False)
    out = capsys.readouterr().out
    assert "plan 1 by" in out and "answered" in out and "answer 5" in out
    # the requirement in brackets is printed as written, not taken for rich markup
    assert "step 1: add 2 and 3 [arithmetic, math] -> calc on" in out and "executors" in out
    assert "replaced planner" in out and "invalid plan" in out


def test_an_open_plan_task_fails_at_restart_and_other_tasks_are_left() -> None:
    snap = {**snapshot(), "phase": "running"}
    failed = interrupted_plan(snap, 5)
    assert failed is not None and failed["phase"] == "failed" and "restarted" in failed["failure"]
    assert interrupted_plan({"task_id": "ab", "phase": "running"}, 5) is None
