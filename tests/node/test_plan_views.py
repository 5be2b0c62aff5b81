"""Seeing a plan without a network: the dashboard's plan tree (node/api/dashboard_plans.py)
built from the pipeline's own snapshot as steps complete, and the OpenAI stream of a
plan-mode request (node/api/openai_routes.py, node/api/openai_plans.py) driven by a test
double of the tasks service."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from node.api.dashboard_plans import SHOWN_CHARS, plan_view
from node.api.openai_request import OpenAIError, chat_request, completion_request
from node.api.openai_routes import _Kind, _stream
from node.market.live_plans import LivePlans
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


class PlanTasks:
    """A test double of the tasks service as the OpenAI routes use it for a plan task: its
    snapshots are stored (``LivePlans.update``, as ``TasksService.record`` does) when the
    test says, and ``wait_done`` answers the last one."""

    def __init__(self) -> None:
        self.plans_live = LivePlans()
        self.last: dict[str, Any] = {}

    def store(self, snap: dict[str, Any]) -> None:
        self.last = snap
        self.plans_live.update(snap)

    async def wait_done(self, task_id: str) -> dict[str, Any]:
        assert task_id == self.last["task_id"]
        return self.last


def chunks_of(events: list[str]) -> list[dict[str, Any] | str]:
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in events)
    return [e[6:-2] if e[6:-2] == "[DONE]" else json.loads(e[6:-2]) for e in events]


def test_a_plan_task_streams_a_line_per_step_then_the_answer() -> None:
    parsed = chat_request({"model": "auto", "stream": True,
                           "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": "What is (2+3)*4?"}],
                           "symphony": {"mode": "plan", "planners": 1}}, lambda m: None)
    assert (parsed.ask["mode"], parsed.ask["planners"], parsed.ask["style"]) == ("plan", 1, "cot")
    assert "history" not in parsed.ask
    service = PlanTasks()
    service.store(plan_snapshot(plan_task(0)))
    events: list[str] = []
    sent_before: list[int] = []  # events the client had when each update was stored

    async def main() -> None:
        async def read() -> None:
            async for event in _stream(_Kind(chat=True), service, service.last,  # type: ignore[arg-type]
                                       parsed, 1700000000):
                events.append(event)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for done in (1, 2):  # each step completes while the client reads
                await trio.testing.wait_all_tasks_blocked()
                sent_before.append(len(events))
                service.store(plan_snapshot(plan_task(done)))

    trio.run(main)
    # live: the role chunk and the plan's lines before step 1 ends, step 1's before step 2's
    assert sent_before == [3, 4]
    chunks = chunks_of(events)
    assert chunks[-1] == "[DONE]"
    body = [c for c in chunks if isinstance(c, dict)]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-" + TID.hex()
               for c in body)
    assert body[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [c["choices"][0]["delta"].get("content") for c in body[1:] if c["choices"]]
    assert texts[:4] == [
        "plan 1: planner QQQQQQQQQQQQ replaced (invalid plan: not JSON)\n",
        "plan 1 by PPPPPPPPPPPP: 2 steps\n",
        "plan 1 step 1/2 (generalist on EEEEEEEEEEEE): add 2 and 3 -> 2 + 3 = 5 "
        + "x" * (200 - 11) + "…\n",
        "plan 1 step 2/2 (calc on FFFFFFFFFFFF): multiply by 4 -> 20\n"]
    assert texts[4:] == ["answer: 20", None]
    assert body[-2]["choices"][0]["finish_reason"] == "stop"
    assert body[-1]["choices"] == [] and body[-1]["usage"]["total_tokens"] == 0
    assert body[-1]["symphony"]["answer"] == "20"


def test_a_plan_request_takes_one_user_message() -> None:
    with pytest.raises(OpenAIError) as err:
        chat_request({"model": "auto", "symphony": {"mode": "plan"}, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "What is 2+2?"}]}, lambda m: None)
    assert err.value.param == "messages"
    plain = completion_request({"model": "auto", "prompt": "2+2?",
                                "symphony": {"mode": "plan"}}, lambda m: None)
    assert plain.ask["style"] == "cot"
