"""The ledger's SQLite store: what a machine stored comes back, re-verified, after a reopen."""

from __future__ import annotations

from pathlib import Path

from node.db import Database
from node.ledger.store import SCHEMA, LedgerStore
from protocol.ledger.machine import (
    ForgetAgentCards,
    ForgetAttestations,
    ForgetCapabilities,
    LedgerMachine,
    SetAgents,
    SetCapability,
    StoreAgentCards,
    StoreAttestation,
    StoreCapability,
)
from protocol.ledger.messages import LedgerPush
from protocol.machine import Received, Tick
from tests.protocol.agent_fixtures import card, signed
from tests.protocol.ledger_net import (
    HOUR,
    MINUTE,
    T0,
    attestation,
    gossip,
    identity,
    machine,
    record,
    spec,
)


def _open(path: Path) -> LedgerStore:
    db = Database(path)
    db.apply_schema(SCHEMA)
    return LedgerStore(db)


def _perform(store: LedgerStore, effects: list[object]) -> None:
    for e in effects:
        if isinstance(e, StoreCapability):
            store.save_capability(e.envelope, e.record)
        elif isinstance(e, StoreAttestation):
            store.save_attestation(e.envelope, e.attestation, e.hash)
        elif isinstance(e, ForgetCapabilities):
            store.forget_capabilities(e.peer_ids)
        elif isinstance(e, ForgetAttestations):
            store.forget_attestations(e.hashes)
        elif isinstance(e, StoreAgentCards):
            store.save_agents(e.envelope, e.record)
        elif isinstance(e, ForgetAgentCards):
            store.forget_agents(e.peer_ids)


def _restored(path: Path, now: int) -> tuple[LedgerMachine, LedgerStore]:
    store = _open(path)
    m = machine(0)
    records, atts = store.load()
    store.delete_stale(m.restore(records, atts, now, agents=store.load_agents()))
    return m, store


def _cards(*envelopes: object) -> LedgerPush:
    return LedgerPush(records=(), attestations=(), reply=False, more=False,
                      agents=envelopes)  # type: ignore[arg-type]


def test_a_reopened_store_restores_the_same_ledger(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    store = _open(path)
    m = machine(0)
    _perform(store, m.handle(SetCapability(spec()), T0))
    a, b = identity(1), identity(2)
    push = gossip(
        [record(a, 1), record(a, 2), record(b, 1)],
        [attestation(a, b.peer_id, object_id=bytes([i])) for i in range(20)],
    )
    _perform(store, m.handle(Received("relay", push), T0))
    _perform(store, m.handle(SetAgents((card(),)), T0))
    _perform(store, m.handle(Received("relay", _cards(signed(a, 1, issued=T0),
                                                      signed(a, 2, issued=T0))), T0))
    assert store.counts() == {"records": 3, "attestations": 20, "agents": 2}
    store.db.close()

    again, store2 = _restored(path, T0 + 1)
    assert again.view.digest_hash(T0 + 1) == m.view.digest_hash(T0 + 1)
    assert again.state.records[a.peer_id].record.seq == 2
    # stored bytes are the envelopes as received: they re-serve byte for byte
    assert again.state.records[b.peer_id].envelope == m.state.records[b.peer_id].envelope
    assert again.state.cards.held[a.peer_id] == m.state.cards.held[a.peer_id]._replace(
        received_at_ms=T0 + 1)
    assert again.view.agents(m.peer_id) == m.view.agents(m.peer_id)


def test_expired_and_corrupt_rows_are_deleted_on_load(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    store = _open(path)
    m = machine(0)
    short = attestation(identity(1), identity(2).peer_id, ttl=MINUTE)
    long = attestation(identity(1), identity(2).peer_id, ttl=HOUR, object_id=b"other")
    push = gossip([record(identity(3), 1, ttl=MINUTE)], [short, long])
    _perform(store, m.handle(Received("relay", push), T0))
    _perform(store, m.handle(Received("relay", _cards(signed(identity(4), ttl=MINUTE,
                                                             issued=T0))), T0))
    store.db.execute(
        "INSERT INTO ledger_attestations VALUES(?, 's', 'o', 'task_completed', 0, ?, ?)",
        (b"\x01" * 32, T0 + HOUR, b"\x93not an envelope"),
    )
    store.db.close()

    again, store2 = _restored(path, T0 + 2 * MINUTE)
    assert set(again.state.attestations) == {long.content_hash}
    assert store2.counts() == {"records": 0, "attestations": 1, "agents": 0}


def test_forget_effects_delete_rows(tmp_path: Path) -> None:
    store = _open(tmp_path / "node.db")
    m = machine(0)
    push = gossip(
        [record(identity(3), 1, ttl=MINUTE)],
        [attestation(identity(1), identity(2).peer_id, ttl=MINUTE)],
    )
    _perform(store, m.handle(Received("relay", push), T0))
    _perform(store, m.handle(Received("relay", _cards(signed(identity(4), ttl=MINUTE,
                                                             issued=T0))), T0))
    assert store.counts() == {"records": 1, "attestations": 1, "agents": 1}
    _perform(store, m.handle(Tick(), T0 + MINUTE + m.config.max_record_ttl_ms))
    assert store.counts() == {"records": 0, "attestations": 0, "agents": 0}
