"""Every rejection reason, one table row each: counted per peer, penalized, nothing stored."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.envelope import Envelope
from protocol.codec import decode, encode
from protocol.errors import InvalidMessage
from protocol.ledger.machine import LedgerConfig, StoreAttestation, StoreCapability
from protocol.ledger.messages import LedgerDigest, LedgerPush
from protocol.ledger.records import (
    ATTESTATION_DOMAIN,
    CAPABILITY_DOMAIN,
    MAX_RECORD_BYTES,
    PENALTY_POINTS,
    Attestation,
    AttestationKind,
    CapabilityRecord,
    Rejected,
    Rejection,
    open_attestation,
    open_capability,
)
from protocol.machine import Penalize, Received
from tests.protocol.ledger_net import (
    HOUR,
    MINUTE,
    NET,
    T0,
    attestation,
    gossip,
    identity,
    machine,
    record,
)

A, B, C = identity(1), identity(2), identity(3)
SENDER = identity(9).peer_id


def _forged_signature(env: Envelope) -> Envelope:
    sig = bytes([env.signature[0] ^ 1]) + env.signature[1:]
    return Envelope(
        public_key=env.public_key, domain=env.domain, payload=env.payload, signature=sig
    )


def _v2_payload(env: Envelope) -> bytes:
    items = list(msgpack.unpackb(env.payload, raw=False))
    items[1] = 2
    return msgpack.packb(items, use_bin_type=True)


CASES: list[tuple[str, object, Rejection]] = [
    ("bad signature", lambda: gossip([_forged_signature(record(A, 1))]), Rejection.BAD_SIGNATURE),
    (
        "record for someone else",
        lambda: gossip([record(A, 1, peer_id=B.peer_id)]),
        Rejection.SIGNER_NOT_SUBJECT,
    ),
    ("wrong network", lambda: gossip([record(A, 1, network="othernet")]), Rejection.WRONG_NETWORK),
    (
        "expiry too far",
        lambda: gossip([record(A, 1, ttl=2 * HOUR)]),
        Rejection.EXPIRY_TOO_FAR,
    ),
    (
        "oversized",
        lambda: gossip([Envelope.sign(A, CAPABILITY_DOMAIN, bytes(MAX_RECORD_BYTES + 1))]),
        Rejection.OVERSIZED,
    ),
    (
        "unknown domain version",
        lambda: gossip([record(A, 1, domain="symphony/ledger/capability/v2")]),
        Rejection.UNKNOWN_VERSION,
    ),
    (
        "unknown payload version",
        lambda: gossip([Envelope.sign(A, CAPABILITY_DOMAIN, _v2_payload(record(A, 1)))]),
        Rejection.UNKNOWN_VERSION,
    ),
    (
        "garbage payload",
        lambda: gossip([Envelope.sign(A, CAPABILITY_DOMAIN, b"\xc1garbage")]),
        Rejection.MALFORMED,
    ),
    (
        "attestation in a record's place",
        lambda: gossip([Envelope.sign(A, CAPABILITY_DOMAIN, attestation(A, B.peer_id).payload)]),
        Rejection.MALFORMED,
    ),
    (
        "foreign domain",
        lambda: gossip([record(A, 1, domain="symphony/other/v1")]),
        Rejection.WRONG_DOMAIN,
    ),
    (
        "issued in the future",
        lambda: gossip([record(A, 1, now=T0 + 5 * MINUTE)]),
        Rejection.FROM_FUTURE,
    ),
    (
        "expired record",
        lambda: gossip([record(A, 1, now=T0 - HOUR, ttl=HOUR - 1)]),
        Rejection.EXPIRED,
    ),
    (
        "self attestation",
        lambda: gossip(atts=[attestation(A, A.peer_id)]),
        Rejection.SELF_ATTESTATION,
    ),
    (
        "attestation bad signature",
        lambda: gossip(atts=[_forged_signature(attestation(A, B.peer_id))]),
        Rejection.BAD_SIGNATURE,
    ),
    (
        "attestation wrong network",
        lambda: gossip(atts=[attestation(A, B.peer_id, network="othernet")]),
        Rejection.WRONG_NETWORK,
    ),
    (
        "attestation expiry too far",
        lambda: gossip(atts=[attestation(A, B.peer_id, ttl=31 * 24 * HOUR)]),
        Rejection.EXPIRY_TOO_FAR,
    ),
    (
        "attestation unknown version",
        lambda: gossip(atts=[attestation(A, B.peer_id, domain="symphony/ledger/attestation/v9")]),
        Rejection.UNKNOWN_VERSION,
    ),
    (
        "reply nobody asked for",
        lambda: LedgerPush(records=(record(A, 1),), attestations=(), reply=True, more=False),
        Rejection.UNSOLICITED,
    ),
    (
        "gossip batch too large",
        lambda: gossip(atts=[attestation(A, B.peer_id, object_id=bytes([i])) for i in range(33)]),
        Rejection.OVERSIZED,
    ),
]


@pytest.mark.parametrize("name,make,reason", CASES, ids=[c[0] for c in CASES])
def test_each_rejection_is_counted_penalized_and_not_stored(
    name: str, make, reason: Rejection
) -> None:
    m = machine(0)
    topic = None if reason is Rejection.UNSOLICITED else "ledger"
    effects = m.handle(Received(SENDER, make(), topic), T0)
    assert m.rejections()[SENDER][reason.value] >= 1, m.rejections()
    assert not [e for e in effects if isinstance(e, (StoreCapability, StoreAttestation))]
    assert not m.state.records and not m.state.attestations
    penalties = [e for e in effects if isinstance(e, Penalize)]
    if PENALTY_POINTS[reason]:
        assert penalties and all(p.peer == SENDER for p in penalties)
        assert f"ledger:{reason.value}" in {p.reason for p in penalties}
    else:
        assert not penalties


def test_seq_replay_and_losing_equal_seq() -> None:
    m = machine(0)
    m.handle(Received(SENDER, gossip([record(A, 5)]), "ledger"), T0)
    m.handle(Received(SENDER, gossip([record(A, 4)]), "ledger"), T0)
    assert m.rejections()[SENDER]["seq_replay"] == 1
    # two records with one seq: the larger content hash wins on every node, the other is refused
    x, y = record(A, 6, price_per_1k_tokens=1.0), record(A, 6, price_per_1k_tokens=2.0)
    winner, loser = sorted([x, y], key=lambda e: e.content_hash, reverse=True)
    m.handle(Received(SENDER, gossip([winner, loser]), "ledger"), T0)
    assert m.state.records[A.peer_id].hash == winner.content_hash
    assert m.rejections()[SENDER]["seq_replay"] == 2


def test_attestation_rate_limit_per_sending_peer() -> None:
    m = machine(0, LedgerConfig(attestation_rate_per_minute=50))
    observers = [identity(100 + i) for i in range(60)]
    for i in range(0, 60, 20):
        batch = [attestation(o, B.peer_id) for o in observers[i : i + 20]]
        m.handle(Received(SENDER, gossip(atts=batch), "ledger"), T0)
    assert len(m.state.attestations) == 50
    assert m.rejections()[SENDER]["rate_limited"] == 10
    # tokens come back with time
    more = [attestation(identity(300 + i), B.peer_id) for i in range(5)]
    m.handle(Received(SENDER, gossip(atts=more), "ledger"), T0 + 6_000)
    assert len(m.state.attestations) == 55


def test_observer_quota_keeps_the_smallest_hashes_whatever_the_order() -> None:
    atts = [attestation(A, B.peer_id, object_id=bytes([i]), now=T0) for i in range(10)]
    keep = sorted(e.content_hash for e in atts)[:4]
    for order in (atts, atts[::-1]):
        m = machine(0, LedgerConfig(observer_quota=4))
        for env in order:
            m.handle(Received(SENDER, gossip(atts=[env]), "ledger"), T0)
        assert sorted(m.state.attestations) == keep


def test_penalty_is_capped_per_message() -> None:
    m = machine(0)
    bad = [_forged_signature(record(identity(50 + i), 1)) for i in range(20)]
    effects = m.handle(Received(SENDER, gossip(bad), "ledger"), T0)
    (p,) = [e for e in effects if isinstance(e, Penalize)]
    assert p.points == 100
    assert m.rejections()[SENDER]["bad_signature"] == 20


def test_non_push_on_gossip_topic_is_malformed() -> None:
    m = machine(0)
    d = LedgerDigest(records=(), attestation_count=0, attestation_buckets=b"", reply=False)
    m.handle(Received(SENDER, d, "ledger"), T0)
    assert m.rejections()[SENDER]["malformed"] == 1


def test_cross_field_checks_are_decode_errors() -> None:
    env = record(A, 1)
    rec = decode(env.payload, CapabilityRecord)
    bad = CapabilityRecord(
        **{**{f: getattr(rec, f) for f in rec.__dataclass_fields__}, "free_slots": 5}
    )
    with pytest.raises(InvalidMessage):
        decode(encode(bad), CapabilityRecord)
    att = decode(attestation(A, B.peer_id).payload, Attestation)
    no_evidence = Attestation(
        **{
            **{f: getattr(att, f) for f in att.__dataclass_fields__},
            "kind": AttestationKind.VERIFICATION_FAILED,
        }
    )
    with pytest.raises(InvalidMessage):
        decode(encode(no_evidence), Attestation)


@settings(max_examples=200, deadline=None)
@given(
    payload=st.binary(max_size=600), domain=st.sampled_from([CAPABILITY_DOMAIN, ATTESTATION_DOMAIN])
)
def test_any_signed_garbage_is_rejected_never_raised(payload: bytes, domain: str) -> None:
    env = Envelope.sign(C, domain, payload)
    for opener in (open_capability, open_attestation):
        with pytest.raises(Rejected):
            opener(env, network_id=NET, now_ms=T0)
    m = machine(0)
    m.handle(Received(SENDER, gossip([env], [env]), "ledger"), T0)
    assert not m.state.records and not m.state.attestations
