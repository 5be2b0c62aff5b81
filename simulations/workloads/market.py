"""A task-market swarm for the voting and routing workloads.

Nodes: ``requesters`` nodes that ask (real ``Auction``, score or LinUCB selector) and
``executors`` nodes that answer (real ``Executor`` on the compute cost model), all running
the real ``LedgerMachine`` when ``ledger = true`` (then votes weigh ledger reputation, and
task outcomes become signed attestations that spread). Executors come from the
``[[workload.executors]]`` classes::

    { share = 0.3, device = "rtx4090", skill = 0.8, calibration = 0.8, behaviour = "honest" }

``skill`` is a number or a table per category; ``behaviour`` one of ``BEHAVIOURS``.

With ``[compute] backend = "models"`` executors answer with the real model
(simulations/models_compute.py) and the bank is the shipped evaluation set (real questions of
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
from protocol.ledger.machine import LedgerConfig
from protocol.market.auction import Auction
from protocol.market.events import AuctionConfig, SubmitTask
from protocol.market.executor import ExecutorConfig, ServedModel
from protocol.market.linucb import LinUCBSelector
from protocol.market.selection import ScoreSelector, Selector
from protocol.market.voting import Ballot, vote
from simulations.adversary import (
    Behaviour,
    BidSpammer,
    ColludingVoter,
    LazyExecutor,
    ModelSwapper,
    SybilPraise,
    WrongExecutor,
    unwrap,
)
from simulations.compute import (
    DEVICES,
    CostModel,
    ExecutorProfile,
    Question,
    model_hash,
    question_bank,
)
from simulations.machines.ledger import ledger_spec
from simulations.machines.market import AUCTION, EXECUTOR, auction_spec, executor_spec
from simulations.node import MachineSpec, VirtualNode
from simulations.scenario import Scenario, ScenarioError, workload_value
from simulations.swarm import Swarm, derive_rng
from simulations.workloads.common import MODEL_FAMILY, MODEL_NAME, capability
from simulations.world import build_swarm

BEHAVIOURS = ("honest", "lazy", "wrong", "colluder", "bid_spammer", "sybil", "model_swapper")
NETWORK_ID = "sim"
_NEUTRAL = 1.0


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
    #: what answers StartCompute: ``cost`` or a simulations.models_compute.ModelsCompute
    compute: Any = None

    @property
    def by_peer(self) -> dict[str, VirtualNode]:
        return {n.peer_id: n for n in self.swarm.nodes}

    def correct(self, rec: TaskRecord, answer: str | None) -> bool:
        return answer is not None and answer == rec.question.truth


def _profiles(scenario: Scenario, n_exec: int) -> list[dict[str, Any]]:
    classes = scenario.workload.get("executors") or [{"share": 1.0}]
    total = sum(float(c.get("share", 0)) for c in classes)
    if abs(total - 1.0) > 1e-6:
        raise ScenarioError(
            f"{scenario.name} [workload.executors]: shares add up to {total}, not 1"
        )
    out: list[dict[str, Any]] = []
    for c in classes:
        out += [c] * round(float(c["share"]) * n_exec)
    while len(out) < n_exec:
        out.append(classes[0])
    return out[:n_exec]


def build_market(
    scenario: Scenario,
    *,
    n_exec: int,
    n_req: int,
    seed: int,
    selector: str = "score",
    auction: AuctionConfig | None = None,
    ledger: bool = True,
) -> MarketWorld:
    rng = derive_rng(seed, "market")
    bank, compute = _questions(scenario, rng)
    cost = CostModel(bank)  # the adversaries' wrong answers come from it in either case
    profiles, behaviours = _executors(scenario, n_req, n_exec, rng)
    sybil_peers: list[str] = []
    specs = _MarketSpecs(
        scenario, n_req, profiles, behaviours, cost, compute, sybil_peers, selector, auction, ledger
    )
    swarm = build_swarm(scenario, n_req + n_exec, seed, specs.of, lambda i: profiles.get(i))
    sybil_peers.extend(swarm.nodes[i].peer_id for i, b in behaviours.items() if b == "sybil")
    requesters = list(range(n_req))
    executors = list(range(n_req, n_req + n_exec))
    world = MarketWorld(swarm, cost, bank, requesters, executors, compute=compute or cost)
    if scenario.compute.real:
        world.max_tokens = scenario.compute.max_tokens
    swarm.on_emit("task.done", lambda node, f, now: _ended(world, node, f, now, "done"))
    swarm.on_emit("task.failed", lambda node, f, now: _ended(world, node, f, now, "failed"))
    return world


def _questions(scenario: Scenario, rng: Any) -> tuple[list[Question], Any]:
    """The question bank, and the real model answering it (None: the cost model answers)."""
    if scenario.compute.real:
        from simulations.models_compute import ModelsCompute, evalset_questions

        return evalset_questions(), ModelsCompute(scenario.compute)
    categories = tuple(scenario.workload.get("categories", ["math", "code", "facts"]))
    return question_bank(rng, int(workload_value(scenario, "questions", 2000)), categories), None


def _executors(
    scenario: Scenario, n_req: int, n_exec: int, rng: Any
) -> tuple[dict[int, ExecutorProfile], dict[int, str]]:
    """Each executor's profile and behaviour, by node index (executors follow requesters;
    the classes are dealt to them in a shuffled order, so adversaries are not the first)."""
    classes = _profiles(scenario, n_exec)
    shuffled = list(range(n_exec))
    rng.shuffle(shuffled)
    profiles: dict[int, ExecutorProfile] = {}
    behaviours: dict[int, str] = {}
    for pos, cls in zip(shuffled, classes, strict=True):
        index = n_req + pos
        skill = cls.get("skill", 0.7)
        profiles[index] = ExecutorProfile(
            device=DEVICES[str(cls.get("device", "rtx3090"))],
            skill=dict(skill) if isinstance(skill, dict) else {"*": float(skill)},
            calibration=float(cls.get("calibration", 0.7)),
            fail_rate=float(cls.get("fail_rate", 0.0)),
            label=str(cls.get("behaviour", "honest")),
        )
        behaviours[index] = str(cls.get("behaviour", "honest"))
        if behaviours[index] not in BEHAVIOURS:
            raise ScenarioError(f"{scenario.name}: unknown behaviour {behaviours[index]!r}")
    return profiles, behaviours


class _MarketSpecs:
    """The machines of a market node: a ledger (optional, wrapped for sybils), then an
    auction on requesters and an executor (wrapped for its behaviour) on executors."""

    def __init__(
        self,
        scenario: Scenario,
        n_req: int,
        profiles: dict[int, ExecutorProfile],
        behaviours: dict[int, str],
        cost: CostModel,
        compute: Any,
        sybil_peers: list[str],
        selector: str,
        auction: AuctionConfig | None,
        ledger: bool,
    ) -> None:
        self.n_req = n_req
        self.behaviours = behaviours
        self.cost = cost
        self.sybil_peers = sybil_peers
        self.slots = int(workload_value(scenario, "slots", 2))
        self.selector = selector
        self.auction = auction_spec(self.selector_of, auction or AuctionConfig())
        self.executor = executor_spec(self.exec_config, compute or cost, self.behaviour_of)
        self.ledger: MachineSpec | None = None
        if ledger:
            slots = self.slots
            led = ledger_spec(
                NETWORK_ID,
                LedgerConfig(anti_entropy_ms=30_000),
                lambda node: (
                    capability(node, node.profile.device, slots=slots)
                    if node.index in profiles
                    else None
                ),
            )
            self.ledger = _with_wrapper(led, self.ledger_behaviour)

    def of(self, index: int) -> tuple[MachineSpec, ...]:
        base: tuple[MachineSpec, ...] = (self.ledger,) if self.ledger is not None else ()
        return base + ((self.auction,) if index < self.n_req else (self.executor,))

    def exec_config(self, node: VirtualNode) -> ExecutorConfig:
        d = node.profile.device
        served = ServedModel(
            MODEL_NAME, MODEL_FAMILY, 8192, model_hash(MODEL_NAME), d.tokens_per_s, d.price_per_1k
        )
        return ExecutorConfig(models=(served,), slots=self.slots)

    def behaviour_of(self, node: VirtualNode) -> Behaviour | None:
        kind = self.behaviours.get(node.index, "honest")
        if kind == "lazy":
            return LazyExecutor()
        if kind == "wrong":
            return WrongExecutor(self.cost)
        if kind in ("colluder", "sybil"):
            return ColludingVoter("coalition")
        if kind == "bid_spammer":
            return BidSpammer()
        if kind == "model_swapper":
            return ModelSwapper(self.cost, skill=0.3)
        return None

    def ledger_behaviour(self, node: VirtualNode) -> Behaviour | None:
        if self.behaviours.get(node.index) == "sybil":
            return SybilPraise(self.sybil_peers, 60_000, node.rng)
        return None

    def selector_of(self, node: VirtualNode) -> Selector:
        return LinUCBSelector() if self.selector == "linucb" else ScoreSelector()


def _with_wrapper(spec: MachineSpec, behaviour_of: Any) -> MachineSpec:
    from dataclasses import replace

    from simulations.adversary import Wrapped

    def build(node: VirtualNode) -> Any:
        machine = spec.build(node)
        b = behaviour_of(node)
        return machine if b is None else Wrapped(machine, node, b)

    return replace(spec, build=build)


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
