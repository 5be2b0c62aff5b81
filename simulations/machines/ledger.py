"""Hosting protocol.ledger.machine.LedgerMachine on virtual nodes.

* ``build`` makes the machine from the node's identity and rng and restores it from what the
  node's store kept (``LedgerMachine.restore``, as the daemon does from SQLite at start).
* ``StoreCapability``/``StoreAttestation``/``Forget*`` are performed on the node's store;
  each accepted record version is also reported to ``observer`` (the workload measures
  convergence from the moment a node stores a version, the same moment the daemon persists it).
  The store's records and attestations are the machine's own dicts of held ones (peer ->
  held record, hash -> held attestation), handed to the store when the machine is built: the
  machine returns a ``StoreCapability``/``StoreAttestation`` for every item it adds and a
  ``ForgetCapabilities``/``ForgetAttestations`` for every one it drops, so second dicts kept by
  performing them would hold the same keys, per node (hundreds each, in a swarm of 100,000
  nodes). After a crash the store keeps the dicts of the machine that crashed, which nothing
  changes any more, and the next machine restores from them.
* ``on_boot`` submits the node's ``CapabilitySpec`` (if it advertises one) and its agent
  cards (``agents_of``, if it hosts any): they spread, sync and expire by the same machine.
* ``StoreAgentCards``/``ForgetAgentCards`` keep a node's agent-card records in its store, and
  ``build`` restores them with the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.agents.cards import AgentCard
from protocol.ledger.held import HeldAttestation
from protocol.ledger.machine import (
    CapabilitySpec,
    ForgetAgentCards,
    ForgetAttestations,
    ForgetCapabilities,
    LedgerConfig,
    LedgerMachine,
    SetAgents,
    SetCapability,
    StoreAgentCards,
    StoreAttestation,
    StoreCapability,
)
from protocol.ledger.messages import LEDGER_TOPIC, LedgerDigest, LedgerPush, LedgerSyncRequest
from protocol.ledger.state import HeldRecord
from simulations.node import MachineSpec, Performer, VirtualNode, nothing_to_perform

NAME = "ledger"
MESSAGE_TYPES = (LedgerPush, LedgerDigest, LedgerSyncRequest)
RECORDS = "ledger.records"
ATTESTATIONS = "ledger.attestations"
AGENTS = "ledger.agents"

#: observer(node, effect) of every StoreCapability/StoreAttestation performed
StoreObserver = Callable[[VirtualNode, object], None]


def ledger_spec(
    network_id: str,
    config: LedgerConfig,
    capability_of: Callable[[VirtualNode], CapabilitySpec | None],
    observer: StoreObserver | None = None,
    agents_of: Callable[[VirtualNode], tuple[AgentCard, ...] | None] | None = None,
) -> MachineSpec:
    def build(node: VirtualNode) -> LedgerMachine:
        machine = LedgerMachine(node.identity, network_id, node.rng, config, memo=node.swarm.memo)
        _restore(node, machine)
        # (the module docstring)
        node.store[RECORDS] = machine.state.records
        node.store[ATTESTATIONS] = machine.state.attestations
        return machine

    def on_boot(node: VirtualNode) -> None:
        spec = capability_of(node)
        if spec is not None:
            # after the current instant, so that connections made at boot are in place
            node.swarm.loop.after(0, _advertise, node, node.epoch, spec)
        cards = agents_of(node) if agents_of is not None else None
        if cards is not None:
            node.swarm.loop.after(0, _host_agents, node, node.epoch, cards)

    return MachineSpec(
        name=NAME,
        build=build,
        message_types=MESSAGE_TYPES,
        topics=(LEDGER_TOPIC,),
        performers={
            # (the store's records and attestations are the machine's: the module docstring)
            StoreCapability: _observed(nothing_to_perform, observer),
            StoreAttestation: _observed(nothing_to_perform, observer),
            ForgetCapabilities: nothing_to_perform,
            ForgetAttestations: nothing_to_perform,
            StoreAgentCards: _store_cards,
            ForgetAgentCards: _forget_cards,
        },
        on_boot=on_boot,
    )


def _restore(node: VirtualNode, machine: LedgerMachine) -> None:
    """What the node's store kept, back into a new machine (the daemon's start from SQLite)."""
    records: dict[str, HeldRecord] = node.store.get(RECORDS, {})
    atts: dict[bytes, HeldAttestation] = node.store.get(ATTESTATIONS, {})
    cards: dict[str, Any] = node.store.get(AGENTS, {})
    if records or atts or cards:
        report = machine.restore(
            [held.envelope.encode() for _, held in sorted(records.items())],
            [held.envelope.encode() for _, held in sorted(atts.items())],
            node.swarm.machine_now_ms,
            agents=[env.encode() for _, env in sorted(cards.items())],
        )
        node.swarm.metrics.count(
            "ledger_restored_items", report.records + report.attestations + report.agents
        )


def _observed(performer: Performer, observer: StoreObserver | None) -> Performer:
    """``performer``, then ``observer`` told of the effect (``performer`` itself if none)."""
    if observer is None:
        return performer

    def perform_and_observe(node: VirtualNode, name: str, effect: Any) -> None:
        performer(node, name, effect)
        observer(node, effect)

    return perform_and_observe


def _store_cards(node: VirtualNode, name: str, effect: StoreAgentCards) -> None:
    node.store.setdefault(AGENTS, {})[effect.record.peer_id] = effect.envelope


def _forget_cards(node: VirtualNode, name: str, effect: ForgetAgentCards) -> None:
    held = node.store.get(AGENTS, {})
    for peer in effect.peer_ids:
        held.pop(peer, None)


def _host_agents(node: VirtualNode, epoch: int, cards: tuple[AgentCard, ...]) -> None:
    if node.epoch == epoch:
        node.submit(NAME, SetAgents(cards))


def _advertise(node: VirtualNode, epoch: int, spec: CapabilitySpec) -> None:
    if node.epoch == epoch:
        node.submit(NAME, SetCapability(spec))


def ledger_of(node: VirtualNode) -> LedgerMachine:
    from simulations.machines.adversary import unwrap

    machine = unwrap(node.machine(NAME))  # an adversary wrapper holds the honest machine
    if not isinstance(machine, LedgerMachine):
        raise TypeError(f"node {node.index} hosts no ledger machine")
    return machine
