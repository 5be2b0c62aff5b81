"""A task-market swarm for the voting and routing workloads.

Nodes: ``requesters`` nodes that ask (real ``Auction``, score or LinUCB selector) and
``executors`` nodes that answer (real ``Executor`` on the compute cost model), all running
the real ``LedgerMachine`` when ``ledger = true`` (then votes weigh ledger reputation, and
task outcomes become signed attestations that spread). Executors come from the
``[[workload.executors]]`` classes::

    { share = 0.3, device = "rtx4090", skill = 0.8, calibration = 0.8, behaviour = "honest" }

``skill`` is a number or a table per category; ``behaviour`` one of ``BEHAVIOURS``
(simulations/workloads/market_nodes.py builds each node's machines).

Requesters weigh votes and rank bids by earned reputation (``protocol.ledger.trust``) and pick
independent executors (``ScoreSelector`` with praise groups). ``build_market(rule="today")``
gives them the former rule instead, for comparison: raw ledger reputation, confidence counted
as claimed (``today_weight``), no independence.

With ``[compute] backend = "models"`` executors answer with the real model
(simulations/compute/models_backend.py) and the bank is the shipped evaluation set (real questions of
number or choice type, ``truth`` normalized as the daemon's vote does).

Tasks arrive as a Poisson stream (``tasks_per_min``) at random requesters, each a random
question of the bank. Every task's end (``task.done`` / ``task.failed``) is recorded once
with its ballots, so the workloads can score the protocol's weighted vote, a plain majority
(the same ``protocol.market.voting.vote`` with neutral weights) and a single executor on the very
same answers. Conservation: a task that ends twice, or never, is counted in ``violations``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from protocol.answers import AnswerType
from protocol.market.auction import Auction
from protocol.market.events import AuctionConfig, SubmitTask
from protocol.market.voting import Ballot, vote
from simulations.compute.cost import CostModel, Question, question_bank
from simulations.machines.adversary import unwrap
from simulations.machines.market import AUCTION, EXECUTOR
from simulations.node import VirtualNode
from simulations.runner.world import build_swarm
from simulations.scenario import Scenario, ScenarioError, workload_value
from simulations.swarm import Swarm, derive_rng
from simulations.workloads.common import MODEL_NAME
from simulations.workloads.market_nodes import MarketSpecs, deal_executors, former_rule_auction

_NEUTRAL = 1.0
RULES = ("earned", "today")


@dataclass
class TaskRecord:
    task_id: str
    requester: int
    question: Question
    submitted_ms: int
    ended_ms: int = -1
    status: str = ""  # done | failed
    weighted: str | None = None
    majority: str | None = None
    single: str | None = None
    executors: tuple[str, ...] = ()
    partial: bool = False


@dataclass
class MarketWorld:
    swarm: Swarm
    cost: CostModel
    questions: list[Question]
    requesters: list[int]
    executors: list[int]
    records: dict[str, TaskRecord] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    submitted: int = 0
    #: each task's generation budget (SubmitTask.max_tokens)
    max_tokens: int = 512
    #: what answers StartCompute: ``cost`` or a simulations.compute.models_backend.ModelsCompute
    compute: Any = None

    @property
    def by_peer(self) -> dict[str, VirtualNode]:
        return {n.peer_id: n for n in self.swarm.nodes}

    def correct(self, rec: TaskRecord, answer: str | None) -> bool:
        return answer is not None and answer == rec.question.truth


def build_market(
    scenario: Scenario,
    *,
    n_exec: int,
    n_req: int,
    seed: int,
    selector: str = "score",
    auction: AuctionConfig | None = None,
    ledger: bool = True,
    rule: str = "earned",
) -> MarketWorld:
    rng = derive_rng(seed, "market")
    bank, compute = _questions(scenario, rng)
    cost = CostModel(bank)  # the adversaries' wrong answers come from it in either case
    profiles, behaviours = deal_executors(scenario, n_req, n_exec, rng)
    sybil_peers: list[str] = []
    if rule not in RULES:
        raise ScenarioError(f"{scenario.name}: unknown voting rule {rule!r} (one of {RULES})")
    specs = MarketSpecs(
        scenario, n_req, profiles, behaviours, cost, compute, sybil_peers, selector, auction, ledger
    )
    if rule == "today":
        specs.auction = former_rule_auction(specs.selector_of, auction or AuctionConfig())
        specs.independent = False
    swarm = build_swarm(scenario, n_req + n_exec, seed, specs.of, lambda i: profiles.get(i))
    sybil_peers.extend(swarm.nodes[i].peer_id for i, b in behaviours.items() if b == "sybil")
    requesters = list(range(n_req))
    executors = list(range(n_req, n_req + n_exec))
    world = MarketWorld(swarm, cost, bank, requesters, executors, compute=compute or cost)
    if scenario.compute.real:
        world.max_tokens = scenario.compute.max_tokens
    watch_task_ends(swarm, world)
    return world


def watch_task_ends(swarm: Swarm, world: MarketWorld) -> None:
    """Record in ``world`` every task's end as its requester emits it (``task.done`` with the
    votes and executors, or ``task.failed``); a task that ends twice, or that was never
    submitted, is a violation."""
    swarm.on_emit("task.done", lambda node, f, now: _ended(world, node, f, now, "done"))
    swarm.on_emit("task.failed", lambda node, f, now: _ended(world, node, f, now, "failed"))


def _questions(scenario: Scenario, rng: Any) -> tuple[list[Question], Any]:
    """The question bank, and the real model answering it (None: the cost model answers)."""
    if scenario.compute.real:
        from simulations.compute.models_backend import ModelsCompute, evalset_questions

        return evalset_questions(), ModelsCompute(scenario.compute)
    categories = tuple(scenario.workload.get("categories", ["math", "code", "facts"]))
    return question_bank(rng, int(workload_value(scenario, "questions", 2000)), categories), None


def _ended(
    world: MarketWorld, node: VirtualNode, fields: dict[str, Any], now: int, status: str
) -> None:
    tid = str(fields["task_id"])
    rec = world.records.get(tid)
    if rec is None:
        world.violations.append(f"task {tid[:12]} ended but was never submitted")
        return
    if rec.status:
        world.violations.append(f"task {tid[:12]} ended twice ({rec.status}, then {status})")
        return
    rec.status = status
    rec.ended_ms = now
    if status != "done":
        return
    auction: Auction = unwrap(node.machine(AUCTION))
    task = auction.tasks[bytes.fromhex(tid)]
    assert task.outcome is not None  # done means voted: our own machine's state
    rec.weighted = task.outcome.winner
    rec.partial = task.partial
    results = sorted(task.results.items(), key=lambda kv: (kv[1].received_at_ms, kv[0]))
    rec.executors = tuple(p for p, _ in results)
    neutral = [Ballot(p, r.body.answer, _NEUTRAL, _NEUTRAL, _NEUTRAL) for p, r in results]
    kind = AnswerType(task.spec.answer_type)
    rec.majority = vote(neutral, kind, task.spec.choices).winner
    first = vote(neutral[:1], kind, task.spec.choices)
    rec.single = first.winner


def submit(
    world: MarketWorld, requester: int, question: Question, k: int, deadline_ms: int
) -> None:
    swarm = world.swarm
    node = swarm.nodes[requester]
    if not node.up:
        return
    task_id = derive_rng(swarm.seed, f"task/{world.submitted}").randbytes(32)
    world.submitted += 1
    world.records[task_id.hex()] = TaskRecord(task_id.hex(), requester, question, swarm.now_ms)
    node.submit(
        AUCTION,
        SubmitTask(
            question=question.text,
            answer_type=question.answer_type,
            choices=question.choices,
            deadline_ms=deadline_ms,
            k=k,
            model=MODEL_NAME,
            max_tokens=world.max_tokens,
            task_id=task_id,
        ),
    )


def schedule_tasks(
    world: MarketWorld,
    *,
    start_ms: int,
    end_ms: int,
    per_min: float,
    k: int,
    deadline_ms: int,
    label: str = "tasks",
) -> int:
    """Poisson arrivals in [start, end); returns how many were scheduled."""
    rng = derive_rng(world.swarm.seed, f"arrivals/{label}")
    t = float(start_ms)
    count = 0
    while True:
        t += -math.log(1.0 - rng.random()) / (per_min / 60_000.0)
        if t >= end_ms:
            return count
        q = world.questions[rng.randrange(len(world.questions))]
        requester = world.requesters[rng.randrange(len(world.requesters))]
        world.swarm.at_ms(int(t), submit, world, requester, q, k, deadline_ms)
        count += 1


def conservation(world: MarketWorld) -> dict[str, Any]:
    """Every submitted task ended exactly once (done or failed; expired ones fail)."""
    open_tasks = [r.task_id[:12] for r in world.records.values() if not r.status]
    return {
        "tasks_submitted": len(world.records),
        "tasks_done": sum(1 for r in world.records.values() if r.status == "done"),
        "tasks_failed": sum(1 for r in world.records.values() if r.status == "failed"),
        "tasks_never_ended": len(open_tasks),
        "violations": list(world.violations[:10]),
        "every_task_ended_exactly_once": not open_tasks and not world.violations,
    }


def executor_labels(world: MarketWorld) -> dict[str, str]:
    return {
        world.swarm.nodes[i].peer_id: world.swarm.nodes[i].profile.label for i in world.executors
    }


__all__ = [
    "EXECUTOR",
    "MarketWorld",
    "TaskRecord",
    "build_market",
    "conservation",
    "executor_labels",
    "schedule_tasks",
    "submit",
]
