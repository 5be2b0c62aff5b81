"""The plan pipeline (protocol/agents/pipeline.py) driven directly: plans, steps, retries,
replanning, the vote over plans and the delayed rewards. The children's auctions are played by
the test: it reads each ``SubmitTask`` the pipeline asks for and answers with ``ChildFinished``.
"""

from __future__ import annotations

import json
import random

import pytest

from protocol.agents.pipeline import (
    PLAN_STYLE,
    PLANNING_SKILL,
    PipelineConfig,
    PlanPipeline,
)
from protocol.agents.plan_runs import (
    ChildFinished,
    ChildResult,
    PlanUpdated,
    SubmitPlanTask,
    child_finished,
)
from protocol.errors import LocalProtocolError
from protocol.machine import Tick
from protocol.market.events import COMPLETED, WRONG, Attest, CancelTask, Reward, SubmitTask

TASK = b"T" * 32


def plan_text(*steps: tuple[str, str, list[str]]) -> str:
    return json.dumps({"steps": [{"instruction": i, "needs": n, "skills": s}
                                 for i, n, s in steps]})


TWO_STEPS = plan_text(("add 2 and 3", "exact arithmetic", ["arithmetic"]),
                      ("multiply the sum by 4", "exact arithmetic", ["arithmetic"]))
ONE_STEP = plan_text(("compute (2+3)*4", "", []))


def result(peer: str, answer: str, match: float = 1.0, confidence: float = 0.9) -> ChildResult:
    return ChildResult(executor=peer, agent="generalist", answer=answer, confidence=confidence,
                       match_score=match)


class Harness:
    def __init__(self, config: PipelineConfig | None = None, deadline_ms: int = 60_000,
                 answer_type: str = "number") -> None:
        rng = random.Random(7)
        self.rewards: list[Reward] = []
        self.attests: list[Attest] = []
        self.cancels: list[CancelTask] = []
        self.open: list[SubmitTask] = []
        self.snapshots: list[dict[str, object]] = []
        self.p = PlanPipeline(config or PipelineConfig(), lambda peer: 0.5, lambda: rng.randbytes(32))
        self.take(self.p.handle(SubmitPlanTask(task_id=TASK, question="What is (2+3)*4?",
                                               answer_type=answer_type,
                                               deadline_ms=deadline_ms), 0))

    def take(self, effects: list[object]) -> None:
        for e in effects:
            if isinstance(e, SubmitTask):
                self.open.append(e)
            elif isinstance(e, Reward):
                self.rewards.append(e)
            elif isinstance(e, Attest):
                self.attests.append(e)
            elif isinstance(e, CancelTask):
                self.cancels.append(e)
            elif isinstance(e, PlanUpdated):
                self.snapshots.append(e.snapshot)

    def next_child(self, **match: object) -> SubmitTask:
        for n, sub in enumerate(self.open):
            if all(getattr(sub, k) == v for k, v in match.items()):
                return self.open.pop(n)
        raise AssertionError(f"no open child with {match}: {self.open}")

    def finish(self, child: SubmitTask, *results: ChildResult, now: int = 100,
               failure: str = "", tried: tuple[str, ...] = ()) -> None:
        assert child.task_id is not None
        self.take(self.p.handle(ChildFinished(child.task_id, tuple(results), failure,
                                              tried or tuple(r.executor for r in results)), now))

    @property
    def final(self) -> dict[str, object]:
        return self.snapshots[-1]


def run_steps(h: Harness, answers: dict[str, str]) -> None:
    """Answer every open step child; ``answers`` maps a step's instruction fragment to the
    executor's answer, the executor named after the fragment."""
    while h.open:
        child = h.open.pop(0)
        frag = next(f for f in answers if f in child.question.split("Your step")[-1])
        h.finish(child, result(f"ex-{frag}", answers[frag]))


def test_planners_then_steps_then_vote() -> None:
    h = Harness()
    planners = h.next_child(style=PLAN_STYLE)
    assert planners.k == 3 and planners.skills == (PLANNING_SKILL,) and planners.deferred
    assert planners.deadline_ms == 24_000  # plan_share of the task's time
    h.finish(planners, result("p1", TWO_STEPS), result("p2", TWO_STEPS), result("p3", ONE_STEP))
    assert {a.subject for a in h.attests if a.outcome == COMPLETED} == {"p1", "p2", "p3"}
    assert sorted(r.reward for r in h.rewards) == [1.0, 1.0, 1.0]
    # the plans run side by side: each one's first step is open, not its second
    assert len(h.open) == 3 and all("step (1 of" in c.question for c in h.open)
    first = h.open[0]
    assert first.skills == ("arithmetic",) and first.style == "chat" and first.k == 1
    assert first.answer_type == "text" and first.deferred
    run_steps(h, {"add 2 and 3": "5", "multiply": "20", "compute": "20"})
    snap = h.final
    assert snap["phase"] == "done" and snap["answer"] == "20"
    plans = snap["plans"]
    assert isinstance(plans, list) and len(plans) == 3
    assert [len(p["steps"]) for p in plans] == [2, 2, 1]
    step = plans[0]["steps"][1]
    assert step["executor"] == "ex-multiply" and step["output"] == "20"
    assert step["requirement"] == {"needs": "exact arithmetic", "skills": ["arithmetic"]}
    # delayed post-vote rewards and attestations: one per step executor, all agreed
    step_rewards = [r for r in h.rewards if r.peer.startswith("ex-")]
    assert len(step_rewards) == 5 and all(r.reward == 1.0 for r in step_rewards)


def test_step_sees_earlier_outputs_and_final_step_takes_task_type() -> None:
    h = Harness(PipelineConfig(planners=1))
    h.finish(h.next_child(style=PLAN_STYLE), result("p1", TWO_STEPS))
    h.finish(h.next_child(style="chat"), result("e1", "The sum is 5"))
    last = h.next_child()
    assert "1. add 2 and 3 -> The sum is 5" in last.question
    assert last.style == "cot" and last.answer_type == "number"
    assert last.max_price == pytest.approx(1e6 / 2)  # the plan's price, split over its steps


def test_invalid_plan_is_attested_and_replaced_by_a_fresh_planner() -> None:
    h = Harness(PipelineConfig(planners=2))
    h.finish(h.next_child(style=PLAN_STYLE), result("p1", "not json at all"),
             result("p2", ONE_STEP))
    wrong = [a for a in h.attests if a.outcome == WRONG]
    assert [a.subject for a in wrong] == ["p1"] and "invalid plan" in wrong[0].detail
    assert Reward(wrong[0].task_id, "p1", 0.0) in h.rewards
    again = h.next_child(style=PLAN_STYLE)
    assert again.k == 1 and set(again.exclude) == {"p1", "p2"}
    h.finish(again, result("p3", ONE_STEP))
    run_steps(h, {"compute": "20"})
    plans = h.final["plans"]
    assert [p["planner"] for p in plans] == ["p3", "p2"]
    assert plans[0]["replaced"][0]["planner"] == "p1"
    assert h.final["answer"] == "20" and h.p.counters["plans_invalid"] == 1


@pytest.mark.parametrize("text", [
    "", "{}", '{"steps": []}', '{"steps": [{"instruction": "x"}]}', "[1, 2]",
    '{"steps": [{"instruction": "   ", "needs": "", "skills": []}]}',
    '{"steps": [{"instruction": "x", "needs": "", "skills": ["Bad Tag"]}]}',
    "{" * 5000, json.dumps({"steps": [{"instruction": "x", "needs": "", "skills": []}] * 9}),
])
def test_hostile_plans_never_raise(text: str) -> None:
    h = Harness(PipelineConfig(planners=1, replans=0))
    h.finish(h.next_child(style=PLAN_STYLE), result("p1", text))
    assert h.final["phase"] == "failed" and "invalid plan" in str(h.final["failure"])


def test_failed_step_is_retried_without_the_failed_peer_then_the_plan_replans() -> None:
    h = Harness(PipelineConfig(planners=1, step_tries=2, replans=1))
    h.finish(h.next_child(style=PLAN_STYLE), result("p1", ONE_STEP))
    step = h.next_child(style="cot")
    h.finish(step, failure="no result before the deadline", tried=("slow",))
    retry = h.next_child(style="cot")
    assert retry.exclude == ("slow",) and retry.question == step.question
    h.finish(retry, failure="no result before the deadline", tried=("slow2",))
    replan = h.next_child(style=PLAN_STYLE)  # the plan failed: one fresh planner
    assert replan.exclude == ("p1",)
    h.finish(replan, result("p2", ONE_STEP))
    h.finish(h.next_child(style="cot"), result("good", "20"))
    snap = h.final
    assert snap["answer"] == "20" and snap["plans"][0]["planner"] == "p2"
    assert "step 1 failed 2 times" in snap["plans"][0]["replaced"][0]["why"]


def test_a_step_rerouted_by_its_auction_is_counted() -> None:
    h = Harness(PipelineConfig(planners=1))
    h.finish(h.next_child(style=PLAN_STYLE), result("p1", ONE_STEP))
    h.finish(h.next_child(style="cot"), result("second", "20"), tried=("killed", "second"))
    assert h.final["steps_rerouted"] == 1 and h.final["plans"][0]["steps"][0]["peers_tried"] == 2


def test_no_replans_left_fails_the_slot_and_the_other_plan_answers() -> None:
    h = Harness(PipelineConfig(planners=2, step_tries=1, replans=0))
    h.finish(h.next_child(style=PLAN_STYLE), result("p1", ONE_STEP), result("p2", ONE_STEP))
    a, b = h.next_child(), h.next_child()
    h.finish(a, failure="every executor failed", tried=("x",))
    h.finish(b, result("y", "20"))
    snap = h.final
    assert snap["phase"] == "done" and snap["answer"] == "20"
    assert [p["state"] for p in snap["plans"]] == ["failed", "answered"]


def test_disagreeing_plans_reward_the_confirmed_and_attest_the_other_wrong() -> None:
    h = Harness()
    h.finish(h.next_child(style=PLAN_STYLE), result("p1", ONE_STEP), result("p2", ONE_STEP),
             result("p3", ONE_STEP))
    for peer, answer in (("a", "20"), ("b", "20"), ("c", "25")):
        h.finish(h.next_child(), result(peer, answer))
    assert h.final["answer"] == "20"
    by_peer = {r.peer: r.reward for r in h.rewards if r.peer in "abc"}
    assert by_peer == {"a": 1.0, "b": 1.0, "c": 0.0}
    assert {a.subject: a.outcome for a in h.attests if a.subject in "abc"} == {
        "a": COMPLETED, "b": COMPLETED, "c": WRONG}


def test_deadline_cancels_open_children_and_votes_what_answered() -> None:
    h = Harness(PipelineConfig(planners=2), deadline_ms=10_000)
    h.finish(h.next_child(style=PLAN_STYLE), result("p1", ONE_STEP), result("p2", TWO_STEPS))
    h.finish(h.next_child(style="cot"), result("a", "20"))
    open_child = h.next_child(style="chat")
    assert h.p.next_deadline() == 10_000
    h.take(h.p.handle(Tick(), 10_000))
    assert [c.task_id for c in h.cancels] == [open_child.task_id]
    assert h.final["phase"] == "done" and h.final["answer"] == "20"
    assert [p["state"] for p in h.final["plans"]] == ["answered", "failed"]
    h.finish(open_child, result("late", "7"))  # a child finishing after its task: ignored
    assert h.final["answer"] == "20"


def test_no_planner_fails_the_task() -> None:
    h = Harness()
    h.finish(h.next_child(style=PLAN_STYLE), failure="no bids")
    assert h.final["phase"] == "failed" and "no planner answered" in str(h.final["failure"])


def test_unknown_and_repeated_children_are_ignored() -> None:
    h = Harness(PipelineConfig(planners=1))
    planners = h.next_child(style=PLAN_STYLE)
    h.take(h.p.handle(ChildFinished(b"x" * 32, (result("z", ONE_STEP),)), 5))
    h.finish(planners, result("p1", ONE_STEP))
    h.finish(planners, result("p1", "garbage"))  # a second report of the same child
    assert h.p.counters["children_unknown"] == 2 and h.p.counters["plans_valid"] == 1


def test_bad_submits_are_local_errors() -> None:
    h = Harness()
    with pytest.raises(LocalProtocolError):
        h.p.handle(SubmitPlanTask(task_id=TASK, question="q", answer_type="text",
                                  deadline_ms=1000), 0)
    with pytest.raises(LocalProtocolError):
        h.p.handle(SubmitPlanTask(task_id=b"u" * 32, question="q", answer_type="text",
                                  deadline_ms=0), 0)
    with pytest.raises(ValueError):
        PipelineConfig(planners=0)


def test_child_finished_reads_a_snapshot_and_refuses_garbage() -> None:
    data = {"task_id": "ab" * 32, "phase": "done", "failure": "", "tried": ["p"],
            "results": [{"executor": "p", "agent": "g", "answer": "4", "confidence": 0.5,
                         "match_score": True}, "junk"]}
    ev = child_finished(data)
    assert ev is not None and ev.results == (ChildResult("p", "g", "4", 0.5, 0.0),)
    assert ev.tried == ("p",)
    assert child_finished({**data, "phase": "running"}) is None
    assert child_finished({**data, "task_id": "zz"}) is None
    assert child_finished({"phase": "done"}) is None


def test_a_step_question_always_fits_a_task() -> None:
    from protocol.agents.plan_runs import StepRun, step_question
    from protocol.agents.plans import parse_plan
    from protocol.market.messages import MAX_QUESTION_CHARS

    plan = parse_plan(json.dumps({"steps": [
        {"instruction": "x" * 500, "needs": "", "skills": []}] * 8}))
    runs = [StepRun(step=s, output="y" * 5000) for s in plan.steps]
    text = step_question("q" * MAX_QUESTION_CHARS, plan, runs, 7)
    assert len(text) <= MAX_QUESTION_CHARS and text.endswith("x" * 500)
    assert "Your step (8 of 8)" in text
