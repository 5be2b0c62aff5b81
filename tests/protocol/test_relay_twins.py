"""Twin manifests and partial fetches (protocol/relay/twins.py): a model pulled from every
holder at once, a bad chunk refetched elsewhere, a block server's few chunks, a resumed pull."""

from __future__ import annotations

from protocol.machine import Penalize, Received, Send
from protocol.relay.events import (
    AttestBadChunk,
    ChunkRequested,
    FetchVersion,
    PrepareVersion,
    RefuseChunk,
    RejectVersion,
    Restore,
    StoreChunk,
    VersionPrepared,
)
from protocol.relay.machine import RelayMachine
from protocol.relay.manifest import (
    ArtifactFormat,
    ChunkStatus,
    ManifestQuery,
    model_artifact_name,
    model_weights_hash,
)
from protocol.relay.transfer import TransferState
from protocol.relay.twins import BAD_CONTENT_PENALTY
from tests.protocol.relay_net import Net, identity, manifest_for

HOLDERS = [identity(n) for n in (1, 2, 3)]
PULLER = identity(9).peer_id
NAME = model_artifact_name(bytes(range(32)))
CHUNKS = 40


def seeded(window: int = 2) -> tuple[Net, list]:
    """Three holders that each signed their own manifest of the same model file (no
    recipients), and a puller that missed their gossip."""
    n = Net.of([*(h.peer_id for h in HOLDERS), PULLER], window=window)
    n.drop_gossip = True
    ms = [manifest_for(h, [], chunks=CHUNKS, name=NAME, format=ArtifactFormat.GGUF)
          for h in HOLDERS]
    for h, m in zip(HOLDERS, ms, strict=True):
        n.publish(h.peer_id, m)
    return n, ms


def pull(n: Net, only: frozenset[int] | None = None) -> None:
    n.deliver(PULLER, FetchVersion(NAME, ask=tuple(h.peer_id for h in HOLDERS), only=only))


def test_a_pull_asks_the_holders_and_takes_chunks_from_all_three_at_once() -> None:
    n, ms = seeded()
    pull(n)
    asked = [e for e in n.effects(Send, PULLER) if isinstance(e.message, ManifestQuery)]
    assert {e.peer for e in asked} == {h.peer_id for h in HOLDERS}
    planned = [m for m in ms if m.id in n.machines[PULLER].transfers]
    assert len(planned) == 1  # one transfer; the other signers are its holders
    t = n.machines[PULLER].transfers[planned[0].id]
    assert t.state is TransferState.COMPLETE
    assert sorted(t.holders) == sorted(h.peer_id for h in HOLDERS if h.peer_id != t.manifest.signer)
    stored = n.effects(StoreChunk, PULLER)
    assert sorted(s.index for s in stored) == list(range(CHUNKS))
    by_source = {h.peer_id: sum(s.peer == h.peer_id for s in stored) for h in HOLDERS}
    assert all(count >= CHUNKS // 4 for count in by_source.values()), by_source
    # each holder served under the planned manifest's id: the twins are planned there too
    for h in HOLDERS:
        assert planned[0].id in n.machines[h.peer_id].transfers
    # the puller is a holder now: it answers a query
    out = n.machines[PULLER].handle(Received(HOLDERS[0].peer_id, ManifestQuery(name=NAME)), 0)
    assert out == [Send(HOLDERS[0].peer_id, planned[0].message)]


def test_a_bad_chunk_costs_its_sender_and_is_refetched_from_another_holder() -> None:
    n, ms = seeded()
    liar = HOLDERS[1].peer_id
    n.corrupt.add(liar)
    pull(n)
    t = next(iter(n.machines[PULLER].transfers.values()))
    assert t.state is TransferState.COMPLETE
    stored = n.effects(StoreChunk, PULLER)
    assert sorted(s.index for s in stored) == list(range(CHUNKS))
    assert liar not in {s.peer for s in stored}
    bad = n.effects(AttestBadChunk, PULLER)
    assert bad and {b.peer for b in bad} == {liar}
    assert any(p.peer == liar and p.points > 0 for p in n.effects(Penalize, PULLER))
    assert t.failed[liar] is True  # dropped for good


def test_only_some_chunks_are_fetched_and_asking_again_widens_the_set() -> None:
    n, _ = seeded()
    pull(n, frozenset({0, 1, 17}))
    t = next(iter(n.machines[PULLER].transfers.values()))
    assert sorted(s.index for s in n.effects(StoreChunk, PULLER)) == [0, 1, 17]
    assert t.state is TransferState.FETCHING and t.satisfied and not t.complete
    pull(n, frozenset({30}))
    assert sorted(s.index for s in n.effects(StoreChunk, PULLER)) == [0, 1, 17, 30]
    # a chunk it does not want is refused, not queued for ever
    out = n.machines[PULLER].handle(ChunkRequested(HOLDERS[0].peer_id, t.manifest.id, 5), 0)
    assert out == [RefuseChunk(HOLDERS[0].peer_id, t.manifest.id, 5, ChunkStatus.NOT_HELD)]


def test_a_restored_pull_resumes_when_asked_again() -> None:
    m = manifest_for(HOLDERS[0], [], chunks=CHUNKS, name=NAME, format=ArtifactFormat.GGUF)
    me = RelayMachine(PULLER)
    me.handle(Restore(m, frozenset(range(10))), 0)
    assert me.transfers[m.id].state is TransferState.KNOWN  # nobody asked since the restart
    out = me.handle(FetchVersion(NAME, ask=(HOLDERS[0].peer_id,)), 0)
    assert PrepareVersion(m) in out
    out = me.handle(VersionPrepared(m.id, frozenset(range(10))), 0)
    requested = sorted(e.index for e in out if type(e).__name__ == "RequestChunk")
    assert requested and min(requested) == 10  # what is held is not fetched again


def test_rejected_content_penalizes_its_signer_and_every_holder() -> None:
    n, ms = seeded()
    pull(n)
    t = next(iter(n.machines[PULLER].transfers.values()))
    assert model_weights_hash(t.manifest) == bytes(range(32))
    out = n.machines[PULLER].handle(RejectVersion(t.manifest.id, "hash mismatch"), 0)
    assert {p.peer for p in out if isinstance(p, Penalize)} == {h.peer_id for h in HOLDERS}
    assert all(p.points == BAD_CONTENT_PENALTY for p in out if isinstance(p, Penalize))
    assert t.manifest.id not in n.machines[PULLER].transfers
    # a replay of any of the lying manifests plans nothing again
    again = n.machines[PULLER].handle(Received(HOLDERS[0].peer_id, ms[0].message), 0)
    assert not any(isinstance(e, PrepareVersion) for e in again)


def test_a_query_for_nothing_held_gets_no_answer() -> None:
    me = RelayMachine(PULLER)
    assert me.handle(Received(HOLDERS[0].peer_id, ManifestQuery(name=NAME)), 0) == []


def test_a_holder_that_heard_a_twin_before_it_held_the_bytes_still_serves_it() -> None:
    n = Net.of([*(h.peer_id for h in HOLDERS), PULLER], window=2)
    ms = [manifest_for(h, [], chunks=CHUNKS, name=NAME, format=ArtifactFormat.GGUF)
          for h in HOLDERS]
    for h, m in zip(HOLDERS, ms, strict=True):
        n.publish(h.peer_id, m)  # gossiped at once: the later holders heard the earlier ones
    assert ms[0].id in n.machines[HOLDERS[1].peer_id].book.known
    pull(n)
    stored = n.effects(StoreChunk, PULLER)
    assert sorted(s.index for s in stored) == list(range(CHUNKS))
    assert {s.peer for s in stored} == {h.peer_id for h in HOLDERS}
    assert not n.effects(RefuseChunk)


def test_a_peer_that_pulled_earlier_answers_with_a_twin_and_becomes_a_source() -> None:
    first, late = identity(20).peer_id, identity(21).peer_id
    n = Net.of([HOLDERS[0].peer_id, first, late], window=2)
    n.drop_gossip = True
    m = manifest_for(HOLDERS[0], [], chunks=CHUNKS, name=NAME, format=ArtifactFormat.GGUF)
    n.publish(HOLDERS[0].peer_id, m)
    n.deliver(first, FetchVersion(NAME, ask=(HOLDERS[0].peer_id,)))
    assert n.machines[first].latest_complete(NAME) == m  # holds the bytes, signed nothing
    n.deliver(late, FetchVersion(NAME, ask=(HOLDERS[0].peer_id, first)))
    t = n.machines[late].transfers[m.id]
    assert t.state is TransferState.COMPLETE and t.holders == [first]
    assert {s.peer for s in n.effects(StoreChunk, late)} == {HOLDERS[0].peer_id, first}
    # an answer from a peer nobody asked adds no source
    me = RelayMachine(identity(22).peer_id)
    me.handle(FetchVersion(NAME, ask=(HOLDERS[0].peer_id,)), 0)
    me.handle(Received(HOLDERS[0].peer_id, m.message), 0)
    me.handle(Received(first, m.message), 0)
    assert me.transfers[m.id].holders == []
