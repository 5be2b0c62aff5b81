"""The ledger machine: own records, merge, expiry, queries, restore."""

from __future__ import annotations

import random

import pytest

from protocol.codec import decode
from protocol.errors import LocalProtocolError
from protocol.ledger.machine import (
    Attest,
    ForgetAttestations,
    ForgetCapabilities,
    LedgerConfig,
    LedgerMachine,
    SetCapability,
    SetLoad,
    StoreAttestation,
    StoreCapability,
)
from protocol.ledger.messages import LedgerPush
from protocol.ledger.records import (
    CAPABILITY_DOMAIN,
    AttestationKind,
    CapabilityRecord,
    Role,
    open_capability,
)
from protocol.ledger.reputation import NEUTRAL
from protocol.machine import Publish, Received, Tick
from tests.protocol.ledger_net import (
    HOUR,
    MINUTE,
    NET,
    T0,
    attestation,
    gossip,
    identity,
    machine,
    offer,
    record,
    spec,
)

A, B, C = identity(1), identity(2), identity(3)
SENDER = identity(9).peer_id


def _published(effects: list[object]) -> list[CapabilityRecord]:
    out = []
    for e in effects:
        if isinstance(e, Publish):
            assert isinstance(e.message, LedgerPush)
            for env in e.message.records:
                out.append(decode(env.verify(CAPABILITY_DOMAIN), CapabilityRecord))
    return out


def test_set_capability_signs_stores_and_publishes_a_checkable_record() -> None:
    m = machine(0)
    effects = m.handle(SetCapability(spec()), T0)
    (store,) = [e for e in effects if isinstance(e, StoreCapability)]
    (pub,) = [e for e in effects if isinstance(e, Publish)]
    assert pub.topic == "ledger"
    rec = open_capability(store.envelope, network_id=NET, now_ms=T0)
    assert rec.peer_id == m.peer_id and rec.seq >= T0 and rec.models == (offer(),)
    assert store.envelope.domain == CAPABILITY_DOMAIN
    assert m.view.capability(m.peer_id, T0) is not None


def test_load_changes_coalesce_and_refresh_moves_seq_forward() -> None:
    cfg = LedgerConfig(min_republish_ms=2_000, refresh_ms=60_000, record_ttl_ms=180_000)
    m = machine(0, cfg)
    first = _published(m.handle(SetCapability(spec()), T0))[0]
    assert _published(m.handle(SetLoad(free_slots=1, load=0.5), T0 + 100)) == []
    assert _published(m.handle(SetLoad(free_slots=0, load=1.0), T0 + 200)) == []
    assert m.next_deadline() == T0 + 2_000
    (second,) = _published(m.handle(Tick(), T0 + 2_000))
    assert second.seq > first.seq and second.free_slots == 0 and second.load == 1.0
    # an unchanged load publishes nothing until the refresh is due
    assert _published(m.handle(SetLoad(free_slots=0, load=1.0), T0 + 5_000)) == []
    assert m.next_deadline() == T0 + 2_000 + 60_000
    (third,) = _published(m.handle(Tick(), T0 + 62_000))
    assert third.seq > second.seq and third.expires_at_ms == T0 + 62_000 + 180_000


def test_own_record_from_a_previous_life_is_overtaken() -> None:
    m = machine(1)  # identity(1) == A
    old = record(A, T0 + 10_000)  # seq above what a fresh start would pick
    m.handle(Received(SENDER, gossip([old]), "ledger"), T0)
    effects = m.handle(SetCapability(spec()), T0 + 1)
    (rec,) = _published(effects)
    assert rec.seq > T0 + 10_000
    assert m.state.records[A.peer_id].record.seq == rec.seq


def test_invalid_local_use_is_a_local_error() -> None:
    m = machine(0)
    with pytest.raises(LocalProtocolError):
        m.handle(SetCapability(spec(free_slots=3, max_slots=2)), T0)
    with pytest.raises(LocalProtocolError):
        m.handle(SetLoad(free_slots=1, load=0.1), T0)
    with pytest.raises(LocalProtocolError):
        m.handle(Attest(subject=m.peer_id, object_id=b"x", kind=AttestationKind.TASK_COMPLETED), T0)
    with pytest.raises(LocalProtocolError):
        m.handle(
            Attest(subject=A.peer_id, object_id=b"x", kind=AttestationKind.VERIFICATION_FAILED), T0
        )


def test_attest_stores_and_publishes_and_moves_reputation() -> None:
    m = machine(0)
    assert m.view.reputation(A.peer_id, T0) == NEUTRAL
    effects = m.handle(
        Attest(
            subject=A.peer_id,
            object_id=b"t1",
            kind=AttestationKind.VERIFICATION_FAILED,
            evidence_hash=bytes(32),
        ),
        T0,
    )
    assert [type(e) for e in effects] == [StoreAttestation, Publish]
    assert m.view.reputation(A.peer_id, T0).score < 0.1


def test_newer_seq_replaces_and_expired_records_stop_counting_then_are_forgotten() -> None:
    m = machine(0)
    m.handle(Received(SENDER, gossip([record(A, 1, ttl=10 * MINUTE)]), "ledger"), T0)
    m.handle(
        Received(
            SENDER, gossip([record(A, 2, ttl=10 * MINUTE, price_per_1k_tokens=3.0)]), "ledger"
        ),
        T0,
    )
    assert m.state.records[A.peer_id].record.seq == 2
    assert [p.record.price_per_1k_tokens for p in m.view.find_peers(T0)] == [3.0]
    later = T0 + 10 * MINUTE
    assert m.view.find_peers(later) == [] and m.view.capability(A.peer_id, later) is None
    # the expired record is a tombstone: an older, still valid record cannot come back
    m.handle(
        Received(SENDER, gossip([record(A, 1, now=later - MINUTE, ttl=30 * MINUTE)]), "ledger"),
        later,
    )
    assert m.rejections()[SENDER]["seq_replay"] == 1
    assert m.view.digest_hash(later) == machine(5).view.digest_hash(later)  # digest: live only
    gone = T0 + 10 * MINUTE + LedgerConfig().max_record_ttl_ms
    effects = m.handle(Tick(), gone)
    assert ForgetCapabilities((A.peer_id,)) in effects and not m.state.records


def test_attestations_expire_and_reputation_follows() -> None:
    m = machine(0)
    short = attestation(B, A.peer_id, ttl=MINUTE, kind=AttestationKind.TASK_FAILED)
    long = attestation(C, A.peer_id, ttl=HOUR)
    m.handle(Received(SENDER, gossip(atts=[short, long]), "ledger"), T0)
    before = m.view.reputation(A.peer_id, T0)
    assert before.evidence == 2 and before.score == pytest.approx(0.5)
    assert m.next_deadline() == T0 + MINUTE
    effects = m.handle(Tick(), T0 + MINUTE)
    assert ForgetAttestations((short.content_hash,)) in effects
    after = m.view.reputation(A.peer_id, T0 + MINUTE)
    assert after.evidence == 1 and after.score > before.score


def test_reputation_cache_is_invalidated_by_new_attestations() -> None:
    m = machine(0)
    m.handle(Received(SENDER, gossip(atts=[attestation(B, A.peer_id)]), "ledger"), T0)
    first = m.view.reputation(A.peer_id, T0)
    assert m.view.reputation(A.peer_id, T0 + 1) is first  # same epoch, same evidence: cached
    m.handle(Received(SENDER, gossip(atts=[attestation(C, A.peer_id)]), "ledger"), T0 + 2)
    second = m.view.reputation(A.peer_id, T0 + 2)
    assert second.evidence == 2 and second.score > first.score


def test_find_peers_filters_and_sorts() -> None:
    m = machine(0)
    big = offer(name="qwen-7b", family="qwen", tps=5.0, ctx=8192)
    small = offer(name="qwen-0.5b", family="qwen", tps=50.0, ctx=2048)
    recs = [
        record(A, 1, models=(big,), roles=(Role.EXECUTOR,), price_per_1k_tokens=2.0, free_slots=0),
        record(
            B, 1, models=(small, big), roles=(Role.EXECUTOR, Role.VERIFIER), price_per_1k_tokens=1.0
        ),
        record(C, 1, models=(offer(),), roles=(Role.RELAY,), price_per_1k_tokens=0.1),
    ]
    m.handle(Received(SENDER, gossip(recs), "ledger"), T0)
    m.handle(Received(SENDER, gossip(atts=[attestation(C, A.peer_id)]), "ledger"), T0)
    ids = lambda ms: [x.peer_id for x in ms]  # noqa: E731
    assert ids(m.view.find_peers(T0, model="qwen-7b", role=Role.EXECUTOR)) == [A.peer_id, B.peer_id]
    assert ids(m.view.find_peers(T0, model="qwen-7b", need_free_slot=True)) == [B.peer_id]
    assert ids(m.view.find_peers(T0, role=Role.VERIFIER)) == [B.peer_id]
    assert ids(m.view.find_peers(T0, family="qwen", min_context=4096, sort_by="price")) == [
        B.peer_id,
        A.peer_id,
    ]
    by_tps = m.view.find_peers(T0, family="qwen", sort_by="tokens_per_s")
    assert ids(by_tps) == [B.peer_id, A.peer_id] and by_tps[0].offer == small
    assert ids(m.view.find_peers(T0, sort_by="price")) == [C.peer_id, B.peer_id, A.peer_id]
    assert m.view.find_peers(T0, model="nope") == []
    dearest = m.view.find_peers(T0, sort_by=lambda p: -p.record.price_per_1k_tokens)
    assert ids(dearest) == [A.peer_id, B.peer_id, C.peer_id]


def test_restore_reverifies_and_reports_stale_rows() -> None:
    m = machine(0)
    m.handle(SetCapability(spec()), T0)
    live, dying = record(A, 1, ttl=HOUR), record(B, 1, ttl=MINUTE)
    att = attestation(C, A.peer_id)
    m.handle(Received(SENDER, gossip([live, dying], [att]), "ledger"), T0)
    stored_records = [m.state.records[p].envelope.encode() for p in sorted(m.state.records)]
    later = T0 + 2 * MINUTE
    fresh = machine(0)
    report = fresh.restore(stored_records + [b"\x93junk"], [att.encode(), b"junk"], later)
    assert report.records == 2 and report.attestations == 1
    assert dying.encode() in report.stale_records and b"\x93junk" in report.stale_records
    assert report.stale_attestations == [b"junk"]
    assert fresh.view.capability(A.peer_id, later) is not None
    # the restored own record keeps the seq moving forward
    (rec,) = [
        decode(e.message.records[0].payload, CapabilityRecord)
        for e in fresh.handle(SetCapability(spec()), later)
        if isinstance(e, Publish)
    ]
    assert rec.seq > m.state.records[m.peer_id].record.seq


def test_clock_offset_maps_the_drivers_clock_to_epoch_time() -> None:
    offset = T0 - 5_000  # the driver's clock reads 5_000 at epoch T0
    m = LedgerMachine(identity(0), NET, random.Random(0), LedgerConfig(), clock_offset_ms=offset)
    (store,) = [e for e in m.handle(SetCapability(spec()), 5_000) if isinstance(e, StoreCapability)]
    assert store.record.issued_at_ms == T0
    assert m.next_deadline() == 5_000 + LedgerConfig().refresh_ms
    m.handle(Received(SENDER, gossip([record(A, 1, ttl=MINUTE)]), "ledger"), 5_000)
    assert m.view.capability(A.peer_id, 5_000) is not None
    assert m.view.capability(A.peer_id, 5_000 + MINUTE) is None
    assert [p.peer_id for p in m.view.find_peers(5_000 + MINUTE)] == [m.peer_id]
    assert m.view.digest_hash(5_000) == m.view.digest_hash(5_001)
    assert m.status(5_000)["live_peers"] == 2


def test_attestations_leave_in_expiry_order_however_their_merges_and_ticks_interleave() -> None:
    """Expiry entries are pushed lazily (at a prune or a removal): attestations merged before
    and after a tick that prunes nothing still leave at their own expiry, in order."""
    m = machine(0)
    three, one, two = (
        attestation(B, A.peer_id, ttl=k * MINUTE, object_id=bytes([k])) for k in (3, 1, 2)
    )
    m.handle(Received(SENDER, gossip(atts=[three]), "ledger"), T0)
    early = m.handle(Tick(), T0 + MINUTE // 2)
    assert not any(isinstance(e, ForgetAttestations) for e in early)  # nothing due yet
    m.handle(Received(SENDER, gossip(atts=[one, two]), "ledger"), T0 + MINUTE // 2)
    assert m.next_deadline() == T0 + MINUTE
    forgotten = []
    for k in (1, 2, 3):
        effects = m.handle(Tick(), T0 + k * MINUTE)
        forgotten += [h for e in effects if isinstance(e, ForgetAttestations) for h in e.hashes]
    assert forgotten == [one.content_hash, two.content_hash, three.content_hash]
    assert not m.state.attestations and not m.state.by_subject
