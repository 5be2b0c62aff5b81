"""Hosting the task market on virtual nodes: the requester's Auction and the Executor.

As node/market/requester.py and node/market/executor.py do for the daemon:

* the auction's ``reputation`` callback is the node's earned reputation of the peer
  (``protocol.ledger.trust.TrustView`` over its ledger machine, as the daemon's; 0.5 without
  a ledger), and ``trust_view`` gives selectors the same view; its ``Attest`` effects
  become ledger ``Attest`` commands through
  ``protocol.market.attestations.ledger_attestation``, the daemon's very mapping;
  ``TaskUpdated`` snapshots go to the node's store;
* the executor's ``StartCompute`` runs on the compute model (or a real solver) and comes back
  as ``ComputeDone``/``ComputeFailed`` after the compute time; ``CancelCompute`` drops a
  computation that has not finished.

Behaviours (simulations/machines/adversary.py) wrap either machine when ``behaviour_of`` names one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.agents.cards import AgentCards
from protocol.agents.wire import AgentMatch, agent_matcher
from protocol.ledger.trust import TrustView
from protocol.market.attestations import ledger_attestation
from protocol.market.auction import Auction, AuctionOptions
from protocol.market.bidders import possible_bidders
from protocol.market.events import (
    Attest,
    AuctionConfig,
    CancelCompute,
    StartCompute,
    TaskUpdated,
)
from protocol.market.executor import Executor, ExecutorConfig
from protocol.market.messages import BEACON_TOPIC, Assign, Beacon, Bid, Cancel, Reject, Result
from protocol.market.selection import Selector
from protocol.market.state import OpenTask
from simulations.machines.adversary import Behaviour, Wrapped, unwrap
from simulations.node import MachineSpec, VirtualNode

AUCTION = "auction"
EXECUTOR = "executor"
SNAPSHOTS = "tasks.snapshots"
_RUNNING = "compute.running"

BehaviourOf = Callable[[VirtualNode], Behaviour | None]
_TRUST = "ledger.trust"


def trust_view(node: VirtualNode) -> TrustView | None:
    """The node's ``TrustView`` over its ledger machine (None when it hosts no ledger)."""
    slot = node.slots.get("ledger")
    if slot is None:
        return None
    view = unwrap(slot.machine).view
    held: TrustView | None = node.store.get(_TRUST)
    if held is None or held.view is not view:
        held = node.store[_TRUST] = TrustView(view)
    return held


def earned_reputation(node: VirtualNode) -> Callable[[str], float]:
    """The auction's ``reputation`` callback: the peer's earned reputation at the node's now."""

    def reputation(peer: str) -> float:
        trust = trust_view(node)
        return 0.5 if trust is None else trust.record(peer, node.swarm.machine_now_ms)

    return reputation


def ledger_bidders(node: VirtualNode) -> Callable[[OpenTask], int | None]:
    """The auction's ``possible_bidders`` callback over the node's ledger, as the daemon's."""

    def count(task: OpenTask) -> int | None:
        trust = trust_view(node)
        return None if trust is None else possible_bidders(trust.view, task,
                                                           node.swarm.machine_now_ms)

    return count


def ledger_cards(node: VirtualNode) -> Callable[[str], AgentCards | None]:
    """A peer's live agent cards as the node's ledger holds them (None: none held, or no
    ledger). The simulator has no embedder, so it takes a card's vector as it comes."""

    def cards_of(peer: str) -> AgentCards | None:
        trust = trust_view(node)
        return None if trust is None else trust.view.agents(peer, node.swarm.machine_now_ms)

    return cards_of


def ledger_agent_match(node: VirtualNode) -> AgentMatch:
    """The auction's ``agent_match``: protocol.agents.wire.agent_matcher over the node's
    ledger's cards, as the daemon's requester."""
    return agent_matcher(ledger_cards(node))


def _wrap(machine: Any, node: VirtualNode, behaviour_of: BehaviourOf | None) -> Any:
    behaviour = behaviour_of(node) if behaviour_of is not None else None
    return machine if behaviour is None else Wrapped(machine, node, behaviour)


def ledger_options(node: VirtualNode) -> AuctionOptions:
    """The auction's options as the daemon's requester gives them (node/market/requester.py):
    the earned reputation, the ledger's possible bidders and agent cards, the protocol's vote."""
    return AuctionOptions(reputation=earned_reputation(node),
                          possible_bidders=ledger_bidders(node),
                          agent_match=ledger_agent_match(node))


def auction_spec(
    selector_of: Callable[[VirtualNode], Selector],
    config: AuctionConfig,
    behaviour_of: BehaviourOf | None = None,
    options_of: Callable[[VirtualNode], AuctionOptions] = ledger_options,
) -> MachineSpec:
    """The requester's ``Auction``, its ``options_of(node)`` passed to its constructor as the
    daemon's (the ledger's unless a scenario measures another rule)."""

    def build(node: VirtualNode) -> Any:
        machine = Auction(node.identity, selector_of(node), node.rng, config, options_of(node))
        return _wrap(machine, node, behaviour_of)

    def attest(node: VirtualNode, name: str, effect: Attest) -> None:
        node.swarm.metrics.count(f"task_attest.{effect.outcome}")
        if "ledger" not in node.slots:
            return
        node.submit("ledger", ledger_attestation(effect))

    def task_updated(node: VirtualNode, name: str, effect: TaskUpdated) -> None:
        node.store.setdefault(SNAPSHOTS, {})[effect.snapshot.task_id] = effect.snapshot

    return MachineSpec(
        name=AUCTION,
        build=build,
        message_types=(Bid, Result, Reject),
        performers={Attest: attest, TaskUpdated: task_updated},
    )


def executor_spec(
    config_of: Callable[[VirtualNode], ExecutorConfig],
    backend: Any,  # CostModel or SolverBackend: compute(profile, job, rng)
    behaviour_of: BehaviourOf | None = None,
) -> MachineSpec:
    def build(node: VirtualNode) -> Any:
        return _wrap(Executor(node.identity, config_of(node)), node, behaviour_of)

    def start_compute(node: VirtualNode, name: str, effect: StartCompute) -> None:
        duration_ms, outcome = backend.compute(node.profile, effect, node.rng)
        key = (effect.task.task_id, effect.attempt)
        running: dict[tuple[bytes, int], int] = node.store.setdefault(_RUNNING, {})
        running[key] = node.epoch
        node.swarm.metrics.count("compute_started")
        if outcome is not None:
            node.swarm.loop.after(duration_ms * 1000, _finish, node, key, outcome)

    def cancel_compute(node: VirtualNode, name: str, effect: CancelCompute) -> None:
        node.store.get(_RUNNING, {}).pop((effect.task_id, effect.attempt), None)

    return MachineSpec(
        name=EXECUTOR,
        build=build,
        message_types=(Beacon, Assign, Cancel),
        topics=(BEACON_TOPIC,),
        performers={StartCompute: start_compute, CancelCompute: cancel_compute},
    )


def _finish(node: VirtualNode, key: tuple[bytes, int], outcome: object) -> None:
    running = node.store.get(_RUNNING, {})
    if running.pop(key, None) != node.epoch or not node.up:
        return  # cancelled, or the node crashed while computing
    node.swarm.metrics.count("compute_finished")
    node.submit(EXECUTOR, outcome)
