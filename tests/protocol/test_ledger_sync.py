"""Anti-entropy: digest exchange, bounded pulls, timeouts, no ping-pong, periodic repair."""

from __future__ import annotations

import math

from protocol.ledger.machine import LedgerConfig, LedgerMachine, SetCapability
from protocol.ledger.messages import BucketHave, LedgerDigest, LedgerPush, LedgerSyncRequest
from protocol.ledger.sync import LATE_REPLY_MS, SyncState
from protocol.machine import PeerConnected, Penalize, Received, Send, Tick
from tests.protocol.ledger_net import (
    HOUR,
    T0,
    Net,
    attestation,
    gossip,
    identity,
    machine,
    record,
    spec,
)

OBSERVERS = [identity(1000 + i) for i in range(40)]


def _load(m: LedgerMachine, n: int, *, now: int = T0) -> None:
    """Give ``m`` n attestations (40 observers, spread over minutes to respect the quota)."""
    subject = identity(7).peer_id
    envs = [
        attestation(
            OBSERVERS[i % len(OBSERVERS)],
            subject,
            object_id=i.to_bytes(4, "big"),
            now=now - (i // len(OBSERVERS)) * 60_000,
            ttl=48 * HOUR,
        )
        for i in range(n)
    ]
    for i in range(0, n, 32):  # gossip batches, each from its own relay (rate limits)
        m.handle(Received(f"loader{i}", gossip(atts=envs[i : i + 32]), "ledger"), now)


def test_two_nodes_converge_both_ways_on_connect() -> None:
    net = Net()
    a, b = net.add(machine(1)), net.add(machine(2))
    net.feed(a.peer_id, SetCapability(spec()))
    net.feed(b.peer_id, SetCapability(spec(price_per_1k_tokens=2.0)))
    net.run()  # not connected yet: publishes go nowhere
    a.handle(
        Received(
            "x", gossip([record(identity(3), 1)], [attestation(identity(4), b.peer_id)]), "ledger"
        ),
        T0,
    )
    b.handle(Received("x", gossip(atts=[attestation(identity(5), a.peer_id)]), "ledger"), T0)
    assert len(net.digests()) == 2
    net.connect(a.peer_id, b.peer_id)
    net.run()
    assert len(net.digests()) == 1
    assert len(a.state.records) == 3 and len(a.state.attestations) == 2
    assert net.sent["LedgerDigest"] == 2  # one each on connect; no reply digests were needed


def test_late_joiner_pulls_thousands_in_bounded_batches() -> None:
    n = 2_000
    cfg = LedgerConfig(batch_attestations=256)
    net = Net()
    old, new = net.add(machine(1, cfg)), net.add(machine(2, cfg))
    _load(old, n)
    assert len(old.state.attestations) == n
    net.connect(old.peer_id, new.peer_id)
    net.run()
    assert len(net.digests()) == 1 and len(new.state.attestations) == n
    rounds = net.sent["LedgerSyncRequest"]
    assert rounds <= math.ceil(n / 256) + 1, rounds
    assert new.stats["bytes_sent"] < old.stats["bytes_sent"] / 10  # requests are small
    assert not new.sync.sessions


def test_pulls_one_peer_at_a_time_then_the_queued_one_finds_nothing_left() -> None:
    net = Net()
    joiner = net.add(machine(1))
    holders = [net.add(machine(i)) for i in (2, 3, 4)]
    for h in holders:
        _load(h, 300)
    for h in holders:  # their digests arrive before any reply
        net.links.add(frozenset((joiner.peer_id, h.peer_id)))
        digest = h.sync.send_digest(joiner.peer_id, T0, reply=False).message
        net.feed(joiner.peer_id, Received(h.peer_id, digest))
    states = sorted(s.state.value for s in joiner.sync.sessions.values())
    assert states == ["pulling", "queued", "queued"]
    net.run()
    assert len(net.digests()) == 1
    # the holders hold the same data: once pulled from one, the queued ones have nothing left
    assert net.sent["LedgerSyncRequest"] == 2  # 300 items = 2 batches of 256, from one holder
    assert not joiner.sync.sessions


def test_a_silent_peer_times_out_and_the_queue_moves_on() -> None:
    cfg = LedgerConfig(sync_timeout_ms=5_000)
    net = Net()
    joiner = net.add(machine(1, cfg))
    silent, good = net.add(machine(2, cfg)), net.add(machine(3, cfg))
    _load(silent, 10)
    _load(good, 10)
    net.silent.add(silent.peer_id)  # it never answers, but its digest arrived earlier:
    digest = silent.sync.send_digest(joiner.peer_id, T0, reply=False)
    net.links.add(frozenset((joiner.peer_id, silent.peer_id)))
    net.feed(joiner.peer_id, Received(silent.peer_id, digest.message))
    net.run()
    assert joiner.sync.sessions[silent.peer_id].state is SyncState.PULLING
    net.connect(joiner.peer_id, good.peer_id)
    net.run()
    assert joiner.sync.sessions[good.peer_id].state is SyncState.QUEUED
    assert joiner.next_deadline() == T0 + 5_000
    net.advance(T0 + 5_000)
    assert silent.peer_id not in joiner.sync.sessions
    assert joiner.view.digest_hash(net.now) == good.view.digest_hash(net.now)


def test_a_reply_after_the_timeout_is_no_fault_once_within_late_reply_ms() -> None:
    cfg = LedgerConfig(sync_timeout_ms=5_000)
    joiner, slow = machine(1, cfg), machine(2, cfg)
    _load(slow, 10)
    peer = slow.peer_id
    joiner.handle(PeerConnected(peer), T0)
    digest = slow.sync.send_digest(joiner.peer_id, T0, reply=False)

    def asks(at: int) -> bool:
        out = joiner.handle(Received(peer, digest.message), at)
        return any(isinstance(e, Send) and isinstance(e.message, LedgerSyncRequest) for e in out)

    assert asks(T0)
    joiner.handle(Tick(), T0 + 5_000)  # we gave up on it
    assert peer not in joiner.sync.sessions
    late = LedgerPush(records=(), attestations=(), reply=True, more=False)

    def penalized(at: int) -> bool:
        return any(isinstance(e, Penalize) for e in joiner.handle(Received(peer, late), at))

    assert not penalized(T0 + 9_000)
    assert penalized(T0 + 9_001)  # once per request we gave up on
    assert asks(T0 + 10_000)  # asked again, and again given up on
    joiner.handle(Tick(), T0 + 15_000)
    assert penalized(T0 + 15_000 + LATE_REPLY_MS)


def test_periodic_anti_entropy_repairs_a_partition_without_digest_ping_pong() -> None:
    cfg = LedgerConfig(anti_entropy_ms=30_000, sync_fanout=1)
    net = Net()
    a, b = net.add(machine(1, cfg)), net.add(machine(2, cfg))
    net.connect(a.peer_id, b.peer_id)
    net.run()
    # gossip lost while "partitioned": each holds something the other lacks
    a.handle(Received("x", gossip(atts=[attestation(identity(4), b.peer_id)]), "ledger"), T0)
    b.handle(Received("x", gossip([record(identity(5), 1, ttl=HOUR)]), "ledger"), T0)
    sent_before = net.sent["LedgerDigest"]
    net.advance(T0 + 30_000)
    assert len(net.digests()) == 1
    # each periodic digest drew at most one reply digest, and replies are never answered
    assert net.sent["LedgerDigest"] - sent_before <= 4


def test_items_we_refuse_are_not_asked_for_again() -> None:
    """The joiner keeps 1 attestation per observer-minute, the holder 240: the joiner refuses
    the rest, and must not ask for them again (else it would pull them round after round)."""
    net = Net()
    holder = net.add(machine(1, LedgerConfig(batch_attestations=2)))
    joiner = net.add(machine(2, LedgerConfig(observer_quota=1)))
    flood = [attestation(identity(50), identity(7).peer_id, object_id=bytes([i])) for i in range(6)]
    holder.handle(Received("x", gossip(atts=flood), "ledger"), T0)
    net.connect(holder.peer_id, joiner.peer_id)
    net.run()
    assert set(joiner.state.attestations) == {min(e.content_hash for e in flood)}
    assert net.sent["LedgerSyncRequest"] == 3 and not joiner.sync.sessions


def test_request_answers_are_bounded_and_skip_what_the_asker_has() -> None:
    m = machine(1, LedgerConfig(batch_attestations=10))
    _load(m, 50)
    buckets = sorted({h[0] for h in m.state.attestations})
    have_bucket = buckets[0]
    have = b"".join(h[:8] for h in m.state.bucket(have_bucket))
    req = LedgerSyncRequest(
        records=(),
        buckets=tuple(
            BucketHave(bucket=b, have=have if b == have_bucket else b"") for b in buckets
        ),
        max_attestations=1024,
    )
    (reply,) = [e for e in m.handle(Received("asker", req), T0) if isinstance(e, Send)]
    assert isinstance(reply.message, LedgerPush)
    assert reply.message.reply and reply.message.more and len(reply.message.attestations) == 10
    assert not {e.content_hash for e in reply.message.attestations} & set(
        m.state.bucket(have_bucket)
    )


def test_digest_from_an_unknown_flooder_is_rate_limited() -> None:
    m = machine(1, LedgerConfig(digest_rate_per_minute=3))
    d = LedgerDigest(records=(), attestation_count=0, attestation_buckets=b"", reply=True)
    for _ in range(5):
        m.handle(Received("flood", d), T0)
    assert m.rejections()["flood"]["rate_limited"] == 2
