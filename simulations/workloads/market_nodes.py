"""The nodes of a task-market swarm (simulations/workloads/market.py): executor classes dealt
to nodes, the machines each node hosts, and the former voting rule kept for comparison.

``MarketSpecs`` gives requesters an ``Auction`` (score or LinUCB selector; the score selector
prefers independent executors by the node's praise groups, ``protocol.ledger.trust``) and
executors an ``Executor`` wrapped in their behaviour (simulations/machines/adversary.py), both over a
ledger machine when ``ledger`` is on (sybils' ledgers wrapped in ``SybilPraise``).
``former_rule_auction`` builds a requester under the rule the protocol had before earned
reputation: raw ledger reputation, confidence counted as claimed (``today_weight``), an
executor attested completed when it agrees with the winner, no preference for independence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from protocol.ledger.machine import LedgerConfig
from protocol.market.events import AuctionConfig
from protocol.market.executor import ExecutorConfig, ServedModel
from protocol.market.linucb import LinUCBSelector
from protocol.market.options import AuctionOptions
from protocol.market.selection import ScoreSelector, Selector
from protocol.market.voting import Ballot, VoteRule, weight_factor
from simulations.compute.cost import DEVICES, CostModel, ExecutorProfile, model_hash
from simulations.machines.adversary import (
    AnswerRewriter,
    Behaviour,
    BidSpammer,
    ColludingVoter,
    LazyExecutor,
    ModelSwapper,
    SybilPraise,
    WrongExecutor,
    unwrap,
)
from simulations.machines.ledger import ledger_spec
from simulations.machines.market import (
    auction_spec,
    executor_spec,
    ledger_options,
    trust_view,
)
from simulations.node import MachineSpec, VirtualNode
from simulations.scenario import Scenario, ScenarioError, workload_value
from simulations.workloads.common import MODEL_FAMILY, MODEL_NAME, capability

BEHAVIOURS = ("honest", "lazy", "wrong", "colluder", "bid_spammer", "sybil", "model_swapper")
NETWORK_ID = "sim"


def today_weight(b: Ballot) -> float:
    """The former ballot weight: ledger reputation x confidence as claimed x match."""
    return weight_factor(b.reputation) * weight_factor(b.confidence) * weight_factor(b.match_score)


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


def deal_executors(
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


class MarketSpecs:
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
        self.independent = True
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
            return AnswerRewriter(WrongExecutor(self.cost))
        if kind in ("colluder", "sybil"):
            return AnswerRewriter(ColludingVoter("coalition"))
        if kind == "bid_spammer":
            return BidSpammer()
        if kind == "model_swapper":
            return AnswerRewriter(ModelSwapper(self.cost, skill=0.3))
        return None

    def ledger_behaviour(self, node: VirtualNode) -> Behaviour | None:
        if self.behaviours.get(node.index) == "sybil":
            return SybilPraise(self.sybil_peers, 60_000, node.rng)
        return None

    def selector_of(self, node: VirtualNode) -> Selector:
        if self.selector == "linucb":
            return LinUCBSelector()
        if not self.independent:
            return ScoreSelector()

        def group_of(peer: str) -> str:
            trust = trust_view(node)
            return peer if trust is None else trust.group(peer, node.swarm.machine_now_ms)

        return ScoreSelector(group_of=group_of)


def former_rule_auction(selector_of: Any, config: AuctionConfig) -> MachineSpec:
    """The requester under the former rule: raw ledger reputation, ``today_weight``, an
    executor attested completed when it agrees with the winner (given to the auction's
    constructor, as every option is)."""

    def raw_reputation(node: VirtualNode) -> Any:
        def reputation(peer: str) -> float:
            slot = node.slots.get("ledger")
            if slot is None:
                return 0.5
            view = unwrap(slot.machine).view
            return float(view.reputation(peer, node.swarm.machine_now_ms).score)

        return reputation

    def former_options(node: VirtualNode) -> AuctionOptions:
        return replace(ledger_options(node), reputation=raw_reputation(node),
                       voting=VoteRule(weigh=today_weight, confirm_by_others=False))

    return auction_spec(selector_of, config, options_of=former_options)


def _with_wrapper(spec: MachineSpec, behaviour_of: Any) -> MachineSpec:
    from simulations.machines.adversary import Wrapped

    def build(node: VirtualNode) -> Any:
        machine = spec.build(node)
        b = behaviour_of(node)
        return machine if b is None else Wrapped(machine, node, b)

    return replace(spec, build=build)
