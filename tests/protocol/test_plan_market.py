"""Plan mode over the real task market (protocol/agents/planning.py): the pipeline's planners
and steps go through the ``Auction`` to ``Executor`` machines on the deterministic
MarketNet harness (wire codec, virtual clock). Planners must carry the ``planning`` skill;
a step's executor killed mid-step is replaced by the auction's next candidate; LinUCB gets
each step executor's reward only after the vote over plans."""

from __future__ import annotations

import json
import random

from protocol.agents.cards import AgentCard
from protocol.agents.pipeline import PipelineConfig, PlanPipeline
from protocol.agents.plan_runs import PlanUpdated, SubmitPlanTask
from protocol.agents.planning import PlanningRequester
from protocol.agents.wire import agent_matcher
from protocol.market.auction import AuctionConfig, SubmitTask
from protocol.market.executor import ComputeDone, StartCompute
from protocol.market.linucb import LinUCBSelector
from protocol.market.selection import Selector
from tests.protocol.agent_fixtures import card, cards_ledger
from tests.protocol.market_net import MODEL, MarketNet, ident

PLAN = json.dumps({"steps": [
    {"instruction": "add 2 and 3", "needs": "", "skills": ["arithmetic"]},
    {"instruction": "multiply the sum by 4", "needs": "", "skills": ["arithmetic"]}]})


def generalist() -> AgentCard:
    return card("generalist", skills=("general", "reasoning", "planning"), tools=(),
                description="A general assistant.")


class PlanNet(MarketNet):
    """MarketNet whose requester is a PlanningRequester, and whose executors answer a
    planner with ``PLAN`` and a step by the instruction they read."""

    def __init__(self, n_exec: int, selector: Selector | None = None,
                 agents: tuple[tuple[AgentCard, ...], ...] = ()) -> None:
        cards = {ident(10 + i).peer_id: agents[i] for i in range(len(agents))}
        super().__init__(n_exec, config=AuctionConfig(bid_window_ms=1_000), selector=selector,
                         agent_match=agent_matcher(cards_ledger(cards).get), agents=agents)
        rng = random.Random(3)
        self.pipeline = PlanPipeline(PipelineConfig(planners=2), lambda p: 0.5,
                                     lambda: rng.randbytes(32))
        self.plain_auction = self.auction
        self.auction = PlanningRequester(self.plain_auction, self.pipeline)  # type: ignore[assignment]
        self.plans: list[dict[str, object]] = []

    def perform(self, src: str, effects: list[object]) -> None:
        rest: list[object] = []
        for e in effects:
            if isinstance(e, SubmitTask):  # a child task: the driver hands it back
                self.perform(self.rq, self.auction.handle(e, self.now))
            elif isinstance(e, PlanUpdated):
                self.plans.append(e.snapshot)
            elif isinstance(e, StartCompute) and self.workers[src].behaviour == "ok":
                w = self.workers[src]
                w.started.append(e)
                q = e.task.question
                answer = PLAN if e.task.style == "plan" else (
                    "20" if "multiply" in q.split("Your step")[-1] else "5")
                done = ComputeDone(task_id=e.task.task_id, attempt=e.attempt, answer=answer,
                                   cot=answer, confidence=0.9, tokens=9,
                                   compute_ms=w.compute_ms, model_hash=MODEL.model_hash)
                self.schedule(self.now + w.compute_ms, src, done)
            else:
                rest.append(e)
        super().perform(src, rest)


def test_plans_run_through_the_market_and_are_voted() -> None:
    # the calculator bids first: a step's bid window closes after its first two bids
    net = PlanNet(3, agents=((card("calc"),), (generalist(),), (generalist(),)))
    net.perform(net.rq, net.auction.handle(SubmitPlanTask(
        task_id=b"P" * 32, question="What is (2+3)*4?", answer_type="number",
        deadline_ms=60_000), 0))
    net.step_to(60_000)
    final = net.plans[-1]
    assert final["phase"] == "done" and final["answer"] == "20"
    plans = final["plans"]
    assert isinstance(plans, list) and len(plans) == 2
    gens = {ident(11).peer_id, ident(12).peer_id}
    # only agents with the planning skill plan; the arithmetic steps go to the calculator
    assert {p["planner"] for p in plans} == gens
    for p in plans:
        assert [s["output"] for s in p["steps"]] == ["5", "20"]
        assert {s["agent"] for s in p["steps"]} == {"calc"}
        assert all(s["match_score"] == 1.0 for s in p["steps"])


def test_a_killed_step_executor_is_replaced_by_the_next_candidate() -> None:
    net = PlanNet(3, agents=((generalist(),), (generalist(),), (generalist(),)))
    net.perform(net.rq, net.auction.handle(SubmitPlanTask(
        task_id=b"P" * 32, question="What is (2+3)*4?", answer_type="number",
        deadline_ms=60_000, planners=1), 0))
    for w in net.workers.values():
        w.compute_ms = 2_000

    def step_started() -> str | None:
        return next((p for p, w in net.workers.items()
                     if any(s.task.style != "plan" for s in w.started)), None)

    while (victim := step_started()) is None:
        net.step_to(net.now + 100)
    net.kill(victim)
    net.step_to(60_000)
    final = net.plans[-1]
    assert final["phase"] == "done" and final["answer"] == "20"
    steps = final["plans"][0]["steps"]  # type: ignore[index]
    assert all(s["executor"] not in ("", victim) for s in steps)
    assert steps[0]["peers_tried"] == 2 and final["steps_rerouted"] >= 1


def test_linucb_learns_each_step_only_after_the_plan_vote() -> None:
    selector = LinUCBSelector()
    net = PlanNet(3, selector=selector,
                  agents=((generalist(),), (generalist(),), (generalist(),)))
    net.perform(net.rq, net.auction.handle(SubmitPlanTask(
        task_id=b"P" * 32, question="What is (2+3)*4?", answer_type="number",
        deadline_ms=60_000), 0))
    pulls_before_vote: dict[str, int] = {}
    while not net.plans or net.plans[-1]["phase"] == "running":
        net.step_to(net.now + 50)
        steps_done = [s for p in net.plans[-1]["plans"] for s in p["steps"] if s["done"]]  # type: ignore[union-attr]
        if steps_done and net.plans[-1]["phase"] == "running":
            # steps finished but the vote is not in: no step reward applied yet
            pulls_before_vote = {a: arm.pulls for a, arm in selector.model.arms.items()}
    final = net.plans[-1]
    assert final["phase"] == "done"
    executors = [s["executor"] for p in final["plans"] for s in p["steps"]]  # type: ignore[union-attr]
    after = {a: arm.pulls for a, arm in selector.model.arms.items()}
    # every step's reward arrived at the vote: pulls grew by the steps each executor ran
    for peer in set(executors):
        assert after[peer] - pulls_before_vote.get(peer, 0) >= 1
    assert sum(after.values()) - sum(pulls_before_vote.values()) == len(executors)
    assert not selector.model.pending  # nothing left waiting for a reward


def test_a_child_the_auction_refuses_fails_its_step_not_the_machine() -> None:
    net = PlanNet(3, agents=((generalist(),), (generalist(),), (generalist(),)))
    net.perform(net.rq, net.auction.handle(SubmitPlanTask(
        task_id=b"P" * 32, question="What is (2+3)*4?", answer_type="number",
        deadline_ms=60_000, planners=1), 0))
    while not (step_ids := [s["task_id"] for s in net.plans[-1]["plans"][0]["steps"]  # type: ignore[index]
                            if s["task_id"]] if net.plans[-1]["plans"] else []):
        net.step_to(net.now + 100)  # until the planner answered and its first step is out
    step_ids = [bytes.fromhex(t) for t in step_ids]
    # the same child id submitted again: the auction refuses it (a LocalProtocolError)
    effects = net.auction.handle(SubmitTask(question="x", answer_type="text", deadline_ms=5_000,
                                            task_id=step_ids[0]), net.now)
    net.perform(net.rq, effects)
    assert net.pipeline.counters.get("steps_failed") == 1
