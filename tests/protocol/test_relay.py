"""The relay machine, driven directly and through a tiny synchronous network (relay_net.py)."""

from __future__ import annotations

import random

import pytest

from protocol.errors import LocalProtocolError
from protocol.machine import Penalize, Publish, Received, Send, Tick
from protocol.relay.events import (
    AttestBadChunk,
    ChunkFailed,
    ChunkReceived,
    ChunkRequested,
    DiscardChunk,
    DropVersion,
    FetchVersion,
    PrepareVersion,
    PublishVersion,
    RefuseChunk,
    RequestChunk,
    Restore,
    ServeChunk,
    StoreChunk,
    StreamClosed,
    VersionComplete,
    VersionPrepared,
)
from protocol.relay.machine import RelayMachine
from protocol.relay.manifest import ChunkStatus, RelayManifest, RelayProgress
from protocol.relay.transfer import TransferState
from tests.protocol.relay_net import Net, identity, manifest_for

PUB = identity(1)
IDS = [identity(n).peer_id for n in range(2, 7)]  # 5 peers
ALL = [PUB.peer_id, *IDS]


def net(**machine_args: object) -> Net:
    """These tests pin the single tree's rules (stripes=1); tests/protocol/test_relay_striping.py
    drives the striped plan."""
    return Net.of(ALL, **{"stripes": 1, **machine_args})


def test_one_publisher_five_peers_all_complete() -> None:
    n = net()
    m = manifest_for(PUB, IDS)
    n.publish(PUB.peer_id, m)
    assert n.complete(m) == set(IDS)
    for peer in IDS:
        assert n.stores[peer][m.id] == set(range(m.chunks))
        assert n.machines[peer].latest_complete("model") == m
        # each chunk stored exactly once, each from the plan parent (no failures here)
        stored = n.effects(StoreChunk, peer)
        assert sorted(s.index for s in stored) == list(range(m.chunks))
        parent = n.machines[peer].transfers[m.id].plan.trees[0].parent[peer]
        assert {s.peer for s in stored} == {parent}
    # the publisher sends every chunk once per child in the plan, not once per peer
    plan = n.machines[PUB.peer_id].transfers[m.id].plan.trees[0]
    assert len(n.effects(ServeChunk, PUB.peer_id)) == m.chunks * len(plan.children[PUB.peer_id])


def test_chunks_are_forwarded_the_moment_they_are_stored() -> None:
    # A child's request for a chunk its parent is still fetching waits, and is answered right
    # after the StoreChunk, in the same step: pipelining, not store-the-whole-file-then-serve.
    m = manifest_for(PUB, [IDS[0]], chunks=4)
    relay = RelayMachine(IDS[0], stripes=1)
    relay.handle(Received(PUB.peer_id, m.message, "relay"), 0)
    effects = relay.handle(VersionPrepared(m.id, frozenset()), 0)
    assert [e.index for e in effects if isinstance(e, RequestChunk)] == [0, 1, 2, 3]
    assert relay.handle(ChunkRequested(IDS[1], m.id, 0), 0) == []  # queued, not refused
    effects = relay.handle(ChunkReceived(PUB.peer_id, m.id, 0, m.chunk_hashes[0]), 1)
    assert effects[:2] == [StoreChunk(PUB.peer_id, m.id, 0), ServeChunk(IDS[1], m.id, 0)]


def test_window_bounds_requests_in_flight() -> None:
    m = manifest_for(PUB, [IDS[0]], chunks=20)
    relay = RelayMachine(IDS[0], stripes=1, window=3)
    relay.handle(Received(PUB.peer_id, m.message, "relay"), 0)
    effects = relay.handle(VersionPrepared(m.id, frozenset()), 0)
    assert [e.index for e in effects if isinstance(e, RequestChunk)] == [0, 1, 2]
    effects = relay.handle(ChunkReceived(PUB.peer_id, m.id, 1, m.chunk_hashes[1]), 1)
    assert [e.index for e in effects if isinstance(e, RequestChunk)] == [3]
    assert len(relay.transfers[m.id].in_flight) == 3


@pytest.mark.parametrize("victim_pos", [1, 2, 3])
def test_kill_a_middle_relay_survivors_complete(victim_pos: int) -> None:
    cut_off = 0
    for budget in (40, 120, 260):
        n = net()
        m = manifest_for(PUB, IDS, chunks=30)
        n.budget = budget
        n.publish(PUB.peer_id, m)
        plan = n.machines[PUB.peer_id].transfers[m.id].plan.trees[0]
        victim = plan.order[victim_pos]
        before = {p: len(n.effects(StoreChunk, p)) for p in IDS}
        n.kill(victim)
        n.budget = None
        n.run()
        survivors = set(IDS) - {victim}
        assert survivors <= n.complete(m), (budget, victim_pos)
        for orphan in plan.children[victim]:
            # what it stored after the kill came from bytes already in flight, or from the
            # victim's parent once it re-attached there
            later = {s.peer for s in n.effects(StoreChunk, orphan)[before[orphan] :]} - {victim}
            if later:
                cut_off += 1
                assert later == {plan.parent[victim]}
                reattached = n.emitted("reattached", orphan)
                assert [e.fields["source"] for e in reattached] == [plan.parent[victim]]
    assert cut_off >= 2  # the kills did land mid-transfer


def test_corrupt_relay_is_attested_dropped_and_routed_around() -> None:
    n = net(retry_ms=10)
    m = manifest_for(PUB, IDS, chunks=10)
    plan_probe = RelayMachine(IDS[0], stripes=1)
    plan_probe.handle(Received(PUB.peer_id, m.message), 0)
    plan = plan_probe.transfers[m.id].plan.trees[0]
    liar = plan.order[1]
    n.corrupt.add(liar)
    n.publish(PUB.peer_id, m)
    victim = plan.children[liar][0]
    attests = n.effects(AttestBadChunk, victim)
    assert attests and attests[0].peer == liar and attests[0].expected == m.chunk_hashes[0]
    assert any(isinstance(p, Penalize) and p.peer == liar for p in n.effects(Penalize, victim))
    assert n.effects(DiscardChunk, victim)
    assert set(IDS) - {liar} <= n.complete(m)
    # nothing from the liar was ever stored; after a retry sweep it is still never chosen
    assert not [s for s in n.effects(StoreChunk) if s.peer == liar]
    t = n.machines[victim].transfers[m.id]
    assert t.failed[liar] is True
    n.tick(10_000)
    first_bad = next(
        i for i, (p, e) in enumerate(n.log) if p == victim and isinstance(e, AttestBadChunk)
    )
    assert not [
        e
        for p, e in n.log[first_bad:]
        if p == victim and isinstance(e, RequestChunk) and e.peer == liar
    ]


def test_stale_replayed_and_foreign_manifests() -> None:
    me = RelayMachine(IDS[0], stripes=1)
    v2 = manifest_for(PUB, [IDS[0]], version=2)
    v1 = manifest_for(PUB, [IDS[0]], version=1)
    assert any(
        isinstance(e, PrepareVersion) for e in me.handle(Received(PUB.peer_id, v2.message), 0)
    )
    assert me.handle(Received(PUB.peer_id, v2.message), 0) == []  # replay: nothing
    stale = me.handle(Received(PUB.peer_id, v1.message), 0)
    assert [e.event for e in stale] == ["manifest_stale"]  # type: ignore[attr-defined]
    # another key's "model" is another artifact: it cannot publish versions of PUB's
    impostor = manifest_for(identity(99), [IDS[0]], version=3)
    assert impostor.key != v2.key
    me.handle(Received(IDS[1], impostor.message), 0)
    assert me.transfers[v2.id].state is TransferState.PREPARING  # untouched
    # with a trusted set, an untrusted signer is ignored outright
    picky = RelayMachine(IDS[0], stripes=1, trusted={PUB.peer_id})
    effects = picky.handle(Received(IDS[1], impostor.message), 0)
    assert [e.event for e in effects] == ["manifest_untrusted"]  # type: ignore[attr-defined]
    assert not picky.transfers


def test_invalid_manifest_is_penalized() -> None:
    m = manifest_for(PUB, [IDS[0]])
    env = m.message.envelope
    bad = RelayManifest(
        envelope=type(env)(
            public_key=env.public_key,
            domain=env.domain,
            payload=env.payload + b"\0",
            signature=env.signature,
        )
    )
    effects = RelayMachine(IDS[0], stripes=1).handle(Received(IDS[1], bad), 0)
    assert isinstance(effects[0], Penalize) and effects[0].peer == IDS[1]


def test_newer_version_supersedes_an_unfinished_one() -> None:
    me = RelayMachine(IDS[0], stripes=1)
    v1 = manifest_for(PUB, [IDS[0]], version=1)
    v2 = manifest_for(PUB, [IDS[0]], version=2)
    me.handle(Received(PUB.peer_id, v1.message), 0)
    me.handle(VersionPrepared(v1.id, frozenset()), 0)
    me.handle(ChunkRequested(IDS[1], v1.id, 5), 0)  # a child waits on chunk 5
    effects = me.handle(Received(PUB.peer_id, v2.message), 0)
    assert DropVersion(v1.id, "superseded") in effects
    assert RefuseChunk(IDS[1], v1.id, 5, ChunkStatus.GONE) in effects
    assert v1.id not in me.transfers
    # late bytes for the dropped version are discarded, never stored
    late = me.handle(ChunkReceived(PUB.peer_id, v1.id, 0, v1.chunk_hashes[0]), 1)
    assert late == [DiscardChunk(PUB.peer_id, v1.id, 0)]


def test_resume_requests_only_the_missing_chunks() -> None:
    m = manifest_for(PUB, [IDS[0]], chunks=10)
    me = RelayMachine(IDS[0], stripes=1, window=16)
    effects = me.handle(Restore(m, frozenset({0, 1, 2, 5})), 0)
    assert [e.index for e in effects if isinstance(e, RequestChunk)] == [3, 4, 6, 7, 8, 9]
    # a restart after completion: complete, nothing requested, and it serves at once
    done = RelayMachine(IDS[0], stripes=1)
    assert done.handle(Restore(m, frozenset(range(10))), 0) == []
    assert done.latest_complete("model") == m
    assert done.handle(ChunkRequested(IDS[1], m.id, 9), 0) == [ServeChunk(IDS[1], m.id, 9)]
    # the network resumes one peer half-way: it fetches the rest and completes
    n = net()
    m5 = manifest_for(PUB, IDS, chunks=10)
    n.stores[IDS[2]] = {m5.id: {0, 1, 2, 3, 4}}
    n.publish(PUB.peer_id, m5)
    assert n.complete(m5) == set(IDS)
    assert sorted(s.index for s in n.effects(StoreChunk, IDS[2])) == [5, 6, 7, 8, 9]


def test_identical_chunks_are_fetched_once() -> None:
    m = manifest_for(PUB, [IDS[0]], chunks=6, repeat=True)  # two distinct chunk contents
    n = Net.of([PUB.peer_id, IDS[0]], stripes=1)
    n.publish(PUB.peer_id, m)
    assert n.complete(m) == {IDS[0]}
    assert len(n.effects(StoreChunk, IDS[0])) == 2


def test_stall_timeout_reattaches() -> None:
    m = manifest_for(PUB, IDS[:2], chunks=4)
    # the deeper peer of the two-peer chain
    probe = RelayMachine(IDS[0], stripes=1)
    probe.handle(Received(PUB.peer_id, m.message), 0)
    plan = probe.transfers[m.id].plan.trees[0]
    deep = plan.order[2]
    me = RelayMachine(deep, stripes=1, stall_timeout_ms=500)
    me.handle(Received(PUB.peer_id, m.message), 0)
    effects = me.handle(VersionPrepared(m.id, frozenset()), 100)
    assert {e.peer for e in effects if isinstance(e, RequestChunk)} == {plan.order[1]}
    assert me.next_deadline() == 600
    assert me.handle(Tick(), 599) == []
    effects = me.handle(Tick(), 600)
    assert {e.peer for e in effects if isinstance(e, RequestChunk)} == {PUB.peer_id}
    assert me.next_deadline() == 1100


def test_every_source_failed_then_retry() -> None:
    m = manifest_for(PUB, [IDS[0]], chunks=2)
    me = RelayMachine(IDS[0], stripes=1, retry_ms=50)
    me.handle(Received(PUB.peer_id, m.message), 0)
    me.handle(VersionPrepared(m.id, frozenset()), 0)
    effects = me.handle(ChunkFailed(PUB.peer_id, m.id, 0, "reset"), 10)
    assert not [e for e in effects if isinstance(e, RequestChunk)]
    assert me.next_deadline() == 60
    effects = me.handle(Tick(), 60)
    assert [e.index for e in effects if isinstance(e, RequestChunk)] == [0, 1]


def test_serving_limits_and_refusals() -> None:
    m = manifest_for(PUB, [IDS[0]], chunks=8)
    me = RelayMachine(IDS[0], stripes=1, max_queued_per_peer=2)
    assert me.handle(ChunkRequested(IDS[1], m.id, 0), 0) == [
        RefuseChunk(IDS[1], m.id, 0, ChunkStatus.GONE)
    ]
    me.handle(Received(PUB.peer_id, m.message), 0)
    me.handle(VersionPrepared(m.id, frozenset({3})), 0)
    assert me.handle(ChunkRequested(IDS[1], m.id, 3), 0) == [ServeChunk(IDS[1], m.id, 3)]
    assert me.handle(ChunkRequested(IDS[1], m.id, 4), 0) == []
    assert me.handle(ChunkRequested(IDS[1], m.id, 5), 0) == []
    assert me.handle(ChunkRequested(IDS[1], m.id, 6), 0) == [
        RefuseChunk(IDS[1], m.id, 6, ChunkStatus.BUSY)
    ]
    out_of_range = me.handle(ChunkRequested(IDS[1], m.id, 8), 0)
    assert isinstance(out_of_range[0], Penalize)
    # a waiter that disconnects is forgotten: its chunk arrives and is not served to it
    from protocol.machine import PeerDisconnected

    me.handle(PeerDisconnected(IDS[1]), 0)
    effects = me.handle(ChunkReceived(PUB.peer_id, m.id, 4, m.chunk_hashes[4]), 1)
    assert not [e for e in effects if isinstance(e, ServeChunk)]
    # a node that only knows of a version refuses with NOT_HELD
    bystander = RelayMachine(IDS[3], stripes=1)
    other = manifest_for(PUB, [IDS[0]], chunks=8, version=2)
    bystander.handle(Received(PUB.peer_id, other.message), 0)
    assert bystander.handle(ChunkRequested(IDS[1], other.id, 0), 0) == [
        RefuseChunk(IDS[1], other.id, 0, ChunkStatus.NOT_HELD)
    ]


def test_garbage_collection_keeps_the_newest_versions() -> None:
    n = Net.of([PUB.peer_id, IDS[0]], stripes=1, keep_versions=2)
    ms = [manifest_for(PUB, [IDS[0]], chunks=3, version=v) for v in (1, 2, 3)]
    for m in ms:
        n.publish(PUB.peer_id, m)
    assert n.complete(ms[2]) == {IDS[0]}
    for peer in (PUB.peer_id, IDS[0]):
        assert DropVersion(ms[0].id, "garbage-collected") in n.effects(DropVersion, peer)
        assert set(n.machines[peer].transfers) == {ms[1].id, ms[2].id}


def test_fetch_on_request_by_a_non_recipient() -> None:
    outsider = identity(50).peer_id
    n = Net.of([*ALL, outsider], stripes=1)
    m = manifest_for(PUB, IDS, chunks=6)
    n.publish(PUB.peer_id, m)
    assert outsider not in n.complete(m)
    # remembered, not planned: a node plans only versions it takes part in
    assert m.id in n.machines[outsider].book.known and m.id not in n.machines[outsider].transfers
    n.deliver(outsider, FetchVersion("model"))
    assert outsider in n.complete(m)
    sources = {s.peer for s in n.effects(StoreChunk, outsider)}
    assert PUB.peer_id not in sources  # it pulled from a relay with spare upload


def test_publish_misuse_is_a_local_error() -> None:
    m = manifest_for(PUB, [IDS[0]])
    with pytest.raises(LocalProtocolError):
        RelayMachine(IDS[0], stripes=1).handle(PublishVersion(m), 0)
    me = RelayMachine(PUB.peer_id, stripes=1)
    me.handle(PublishVersion(m), 0)
    with pytest.raises(LocalProtocolError):
        me.handle(PublishVersion(m), 0)


def test_the_manifest_is_gossiped_once_every_recipient_has_the_version() -> None:
    outsider = identity(50).peer_id
    n = Net.of([*ALL, outsider], stripes=1)
    m = manifest_for(PUB, IDS, chunks=6)
    n.publish(PUB.peer_id, m)
    gossip = [i for i, (p, e) in enumerate(n.log) if isinstance(e, Publish)]
    done = [i for i, (p, e) in enumerate(n.log) if isinstance(e, VersionComplete)]
    assert len(gossip) == 1 and n.log[gossip[0]][0] == PUB.peer_id
    assert len(done) == len(IDS) and gossip[0] > max(done)  # recipients went by the plan
    assert m.id in n.machines[outsider].book.known  # and outsiders hear of it after


def test_the_manifest_is_gossiped_after_two_estimates_if_a_recipient_never_completes() -> None:
    n = net()
    m = manifest_for(PUB, IDS, chunks=6)
    n.dead.add(IDS[-1])  # never completes, never reports
    n.publish(PUB.peer_id, m)
    assert not n.effects(Publish)
    due = 2 * n.machines[PUB.peer_id].transfers[m.id].plan.estimated_ms
    assert n.machines[PUB.peer_id].next_deadline() == due
    n.tick(due - 1)
    assert not n.effects(Publish)
    n.tick(due)
    assert len(n.effects(Publish, PUB.peer_id)) == 1
    assert n.machines[PUB.peer_id].next_deadline() is None


def test_a_manifest_naming_no_recipients_is_gossiped_at_once() -> None:
    effects = RelayMachine(PUB.peer_id).handle(PublishVersion(manifest_for(PUB, [])), 0)
    assert any(isinstance(e, Publish) and e.topic == "relay" for e in effects)


@pytest.mark.parametrize("seed", range(12))
def test_random_failures_never_stall_survivors(seed: int) -> None:
    rng = random.Random(seed)
    ids = [identity(n).peer_id for n in range(2, 2 + rng.randrange(3, 12))]
    n = Net.of([PUB.peer_id, *ids], stripes=1, retry_ms=5, window=rng.randrange(1, 6))
    m = manifest_for(PUB, ids, chunks=rng.randrange(5, 40))
    n.budget = rng.randrange(10, 400)
    n.publish(PUB.peer_id, m)
    victims = set(rng.sample(ids, rng.randrange(1, max(2, len(ids) // 3))))
    for v in victims:
        n.kill(v)
    n.budget = None
    n.run()
    for t in range(1, 4):  # retry sweeps, in case every source had failed for someone
        n.tick(t * 1000)
    assert set(ids) - victims <= n.complete(m), f"seed {seed}"
    for peer in set(ids) - victims:
        assert n.stores[peer][m.id] == set(range(m.chunks)), f"seed {seed}"
    assert all(isinstance(e, VersionComplete) for e in n.effects(VersionComplete))


def test_progress_reports_reach_the_publisher() -> None:
    n = net()
    m = manifest_for(PUB, IDS, chunks=16)
    n.publish(PUB.peer_id, m)
    t = n.machines[PUB.peer_id].transfers[m.id]
    assert t.progress == {p: 16 for p in IDS}
    reports = [
        e
        for p, e in n.log
        if p == IDS[0] and isinstance(e, Send) and isinstance(e.message, RelayProgress)
        and e.peer == PUB.peer_id
    ]
    assert 2 <= len(reports) <= 17 and reports[-1].message.chunks_held == 16


def test_a_stream_protocol_violation_is_penalized() -> None:
    m = manifest_for(PUB, [IDS[0]], chunks=2)
    me = RelayMachine(IDS[0], stripes=1)
    me.handle(Received(PUB.peer_id, m.message), 0)
    me.handle(VersionPrepared(m.id, frozenset()), 0)
    effects = me.handle(ChunkFailed(PUB.peer_id, m.id, 0, "unrequested chunk", penalty=7), 1)
    assert Penalize(PUB.peer_id, "unrequested chunk", 7) in effects


def test_a_closed_stream_forgets_its_waiters() -> None:
    m = manifest_for(PUB, [IDS[0]], chunks=4)
    me = RelayMachine(IDS[0], stripes=1, max_queued_per_peer=1)
    me.handle(Received(PUB.peer_id, m.message), 0)
    me.handle(VersionPrepared(m.id, frozenset()), 0)
    assert me.handle(ChunkRequested(IDS[1], m.id, 2), 0) == []
    me.handle(StreamClosed(IDS[1], m.id), 0)
    assert me.handle(ChunkRequested(IDS[1], m.id, 3), 0) == []  # not BUSY: the slot was freed
    effects = me.handle(ChunkReceived(PUB.peer_id, m.id, 2, m.chunk_hashes[2]), 1)
    assert not [e for e in effects if isinstance(e, ServeChunk)]


def test_lost_gossip_does_not_stall_anyone() -> None:
    n = Net.of([PUB.peer_id, *[identity(k).peer_id for k in range(2, 14)]], stripes=1)
    n.drop_gossip = True
    ids = [identity(k).peer_id for k in range(2, 14)]
    m = manifest_for(PUB, ids, chunks=8)
    n.publish(PUB.peer_id, m)
    assert n.complete(m) == set(ids)  # the manifest went down the plan by unicast
