"""The real ledger machine in the swarm: records spread, restarts restore, churn heals."""

from __future__ import annotations

import random
from dataclasses import replace

from protocol.ledger.machine import (
    Attest,
    CapabilitySpec,
    LedgerConfig,
    SetLoad,
    StoreAttestation,
    StoreCapability,
)
from protocol.ledger.records import AttestationKind, HardwareSummary, ModelOffer, Role
from simulations.machines.ledger import ATTESTATIONS, NAME, RECORDS, ledger_of, ledger_spec
from simulations.network import LatencyModel
from simulations.node import VirtualNode
from simulations.swarm import Swarm

OFFER = ModelOffer(
    name="m",
    family="f",
    quantization="q4",
    context_length=4096,
    weights_hash=bytes(32),
    tokens_per_s=30.0,
)
HW = HardwareSummary(device_kind="cpu", device_name="x", memory_bytes=1 << 30, cpu_cores=2)


def capability(node: VirtualNode) -> CapabilitySpec | None:
    if node.index % 3:
        return None
    return CapabilitySpec(
        listen_addrs=(node.addr,),
        models=(OFFER,),
        hardware=HW,
        price_per_1k_tokens=0.1,
        free_slots=1,
        max_slots=1,
        load=0.0,
        roles=(Role.EXECUTOR,),
    )


def make(
    seed: int,
    n: int,
    stored: list[tuple[int, str, int]] | None = None,
    config: LedgerConfig | None = None,
    attested: list[tuple[int, bytes]] | None = None,
) -> Swarm:
    def observe(node: VirtualNode, effect: object) -> None:
        if stored is not None and isinstance(effect, StoreCapability):
            stored.append((node.index, effect.record.peer_id, effect.record.seq))
        if attested is not None and isinstance(effect, StoreAttestation):
            attested.append((node.index, effect.hash))

    swarm = Swarm(seed, latency=LatencyModel("uniform", 5.0, 50.0), wire_bytes=True)
    config = config if config is not None else LedgerConfig(anti_entropy_ms=5_000)
    spec = ledger_spec("sim", config, capability, observe)
    nodes = [swarm.add_node((spec,)) for _ in range(n)]
    rng = random.Random(seed)
    for node in nodes:
        swarm.start(node)
    for node in nodes:
        swarm.connect_random(node, 3, rng)
    return swarm


def digests(swarm: Swarm) -> set[bytes]:
    now = swarm.machine_now_ms
    return {ledger_of(n).view.digest_hash(now) for n in swarm.nodes if n.up}


def test_every_node_converges_to_the_same_ledger() -> None:
    swarm = make(1, 24)
    swarm.run(20_000)
    assert len(digests(swarm)) == 1
    assert all(len(ledger_of(n).state.records) == 8 for n in swarm.nodes)


def test_an_update_reaches_everyone_by_gossip() -> None:
    stored: list[tuple[int, str, int]] = []
    swarm = make(2, 24, stored)
    swarm.run(20_000)
    publisher = swarm.nodes[0]
    stored.clear()
    publisher.submit(NAME, SetLoad(free_slots=0, load=1.0))
    swarm.run(21_000)  # well before the next anti-entropy round could carry it
    receivers = {i for i, peer, _ in stored if peer == publisher.peer_id and i != 0}
    assert receivers == set(range(1, 24))


def test_a_restarted_node_restores_its_ledger_and_a_late_one_syncs() -> None:
    swarm = make(3, 15)
    swarm.run(20_000)
    victim = swarm.nodes[4]
    swarm.crash(victim)
    swarm.start(victim)
    assert len(ledger_of(victim).state.records) == 5  # restored from the store, no peers
    swarm.connect_random(victim, 3, random.Random(0))
    swarm.run(40_000)
    assert len(digests(swarm)) == 1


def test_same_seed_same_ledger_traffic() -> None:
    def run(seed: int) -> tuple[int, ...]:
        swarm = make(seed, 12)
        swarm.run(15_000)
        return tuple(swarm.bytes_per_node())

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_the_ledgers_of_a_swarm_hold_one_copy_of_what_they_share() -> None:
    # each node decodes its own copy of every record (wire_bytes), yet the swarm's memo hands
    # every ledger the same expiry entry per record: the adapter builds them with swarm.memo
    swarm = make(1, 12)
    swarm.run(20_000)
    heaps = [sorted(ledger_of(n).state._record_expiry) for n in swarm.nodes]
    assert len(heaps[0]) == 4
    assert all(x is y for heap in heaps[1:] for x, y in zip(heaps[0], heap, strict=True))


def test_a_restarted_node_restores_the_attestations_it_held_and_no_evicted_one() -> None:
    # the store's attestations are the machine's own dict: after a quota eviction (a
    # ForgetAttestations) and a crash, the next machine restores exactly what was held
    attested: list[tuple[int, bytes]] = []
    config = replace(LedgerConfig(anti_entropy_ms=5_000), observer_quota=2)
    swarm = make(4, 8, config=config, attested=attested)
    swarm.run(5_000)
    author, victim = swarm.nodes[0], swarm.nodes[3]
    for i in range(4):  # one minute, one observer: two are kept, the smallest hashes
        author.submit(NAME, Attest(victim.peer_id, bytes([i]) * 32, AttestationKind.TASK_COMPLETED))
    swarm.run(6_000)
    held = dict(ledger_of(victim).state.attestations)
    stored_by_victim = {h for i, h in attested if i == 3}
    assert len(held) == 2 and len(stored_by_victim) > 2  # some stored, then evicted
    assert set(held) == set(sorted(h for i, h in attested if i == 0)[:2])
    swarm.crash(victim)
    assert set(victim.store[ATTESTATIONS]) == set(held)  # what the crashed machine held
    swarm.start(victim)
    restored = ledger_of(victim).state.attestations
    assert set(restored) == set(held)  # from the store, no peers
    assert victim.store[ATTESTATIONS] is restored
    assert victim.store[RECORDS] is ledger_of(victim).state.records
