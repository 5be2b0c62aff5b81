"""Hosting protocol.relay.machine.RelayMachine on virtual nodes, with chunk bytes as sized transfers.

As node/relay/service.py and node/relay/streams.py do for the daemon:

* ``RequestChunk`` sends a ``ChunkRequest`` frame to the source, which gets ``ChunkRequested``;
  an unreachable or crashed source comes back as ``ChunkFailed`` after the request timeout,
  and a source that crashes with our requests open as ``PeerDisconnected`` after the
  transport's crash detection (the daemon's chunk stream resets).
* A request reaching a source that does not know the version yet delivers the manifest first
  (a chunk stream opens with the manifest frame), then ``ChunkRequested``.
* ``ServeChunk`` streams the chunk: a transfer of its size over the network model (sender's
  uplink, receiver's downlink, latency), arriving as ``ChunkReceived`` with the digest of the
  bytes the server holds; a node's outgoing chunks take turns per destination
  (:class:`BulkSender`). ``RefuseChunk`` arrives as ``ChunkFailed`` with the status.
* ``PrepareVersion`` answers ``VersionPrepared`` with the chunks in the node's store (it
  survives restarts); ``StoreChunk`` keeps the verified digest there; ``DropVersion`` forgets.
* Attestations: ``protocol.relay.attestations.RelayAttestations`` tallies the stored chunks per
  source and yields ``RELAY_SERVED`` when a version completes and ``RELAY_BAD_CHUNK`` for a
  corrupt chunk and ``RELAY_WITHHELD`` for a parent that stalled us, exactly as
  node/relay/service.py does; they go to the node's ledger machine
  when it hosts one, and are counted (``relay_attest.<kind>``) either way.
* Conservation: every digest a server sends comes from its store, and the store only ever
  holds digests that a publisher put there or that arrived and were verified. The adapter
  counts ``relay.unpublished_delivery`` if a digest that no manifest published is delivered
  (a test asserts it never happens) and ``relay.serve_unheld`` if a machine asks to serve a
  chunk its node does not hold.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from protocol.codec import encode
from protocol.ledger.events import Attest as LedgerAttest
from protocol.machine import PeerDisconnected
from protocol.relay.attestations import RelayAttestations
from protocol.relay.events import (
    AttestBadChunk,
    AttestWithheld,
    ChunkFailed,
    ChunkReceived,
    ChunkRequested,
    DiscardChunk,
    DropVersion,
    PrepareVersion,
    PublishVersion,
    RefuseChunk,
    RequestChunk,
    ServeChunk,
    StoreChunk,
    VersionComplete,
    VersionPrepared,
)
from protocol.relay.machine import RelayMachine
from protocol.relay.manifest import (
    RELAY_TOPIC,
    ChunkHeader,
    ChunkRequest,
    ChunkStatus,
    Manifest,
    RelayManifest,
    RelayProgress,
)
from protocol.relay.striping import DEFAULT_STRIPES
from simulations.machines.adversary import Behaviour, Wrapped
from simulations.node import MachineSpec, VirtualNode

NAME = "relay"
CHUNKS = "relay.chunks"  # store: manifest id -> {index: digest}
MANIFESTS = "relay.manifests"  # store: manifest id -> Manifest
_ARRIVED = "relay.arrived"  # store: (manifest id, index) -> digest awaiting StoreChunk
_ATTESTATIONS = "relay.attestations"  # store: (epoch, RelayAttestations)
_REQUEST_BYTES = len(encode(ChunkRequest(manifest_id=bytes(32), index=0))) + 4
_HEADER_BYTES = (
    len(encode(ChunkHeader(manifest_id=bytes(32), index=0, status=ChunkStatus.OK, size=0))) + 4
)
#: a request to a source that cannot answer fails after this long (the stream timeout)
REQUEST_TIMEOUT_MS = 10_000

CompleteObserver = Callable[[VirtualNode, Manifest], None]
AttestObserver = Callable[[VirtualNode, LedgerAttest], None]


class Published:
    """Every (manifest id, index, digest) any publisher put in a store: the conservation set."""

    def __init__(self) -> None:
        self.chunks: set[tuple[bytes, int, bytes]] = set()

    def add(self, manifest: Manifest) -> None:
        for i, h in enumerate(manifest.chunk_hashes):
            self.chunks.add((manifest.id, i, h))


def relay_spec(
    *,
    max_fanout: int,
    window: int,
    published: Published,
    on_complete: CompleteObserver | None = None,
    behaviour_of: Callable[[VirtualNode], Behaviour | None] | None = None,
    stall_timeout_ms: int = 30_000,
    stripes: int = DEFAULT_STRIPES,
    on_attest: AttestObserver | None = None,
) -> MachineSpec:
    def build(node: VirtualNode) -> Any:
        machine = RelayMachine(
            node.peer_id,
            window=window,
            max_fanout=max_fanout,
            stall_timeout_ms=stall_timeout_ms,
            stripes=stripes,
            memo=node.swarm.memo,
        )
        behaviour = behaviour_of(node) if behaviour_of is not None else None
        return machine if behaviour is None else Wrapped(machine, node, behaviour)

    return MachineSpec(
        name=NAME,
        build=build,
        message_types=(RelayManifest, RelayProgress),
        topics=(RELAY_TOPIC,),
        performers=RelayPerformers(published, on_complete, on_attest).table(),
    )


class RelayPerformers:
    """What each relay effect does on a virtual node (see the module docstring)."""

    def __init__(
        self,
        published: Published,
        on_complete: CompleteObserver | None,
        on_attest: AttestObserver | None = None,
    ) -> None:
        self.sender = BulkSender(published)
        self.on_complete = on_complete
        self.on_attest = on_attest
        #: (requester, server) chunk streams watched for the server crashing
        self.watched: set[tuple[int, int]] = set()

    def _attest(self, node: VirtualNode, attestations: list[LedgerAttest]) -> None:
        _attest(node, attestations)
        if self.on_attest is not None:
            for attestation in attestations:
                self.on_attest(node, attestation)

    def table(self) -> dict[type, Callable[[VirtualNode, str, Any], None]]:
        return {
            PrepareVersion: self.prepare,
            RequestChunk: self.request,
            ServeChunk: self.serve,
            RefuseChunk: self.refuse,
            StoreChunk: self.store_chunk,
            DiscardChunk: self.discard,
            VersionComplete: self.complete,
            DropVersion: self.drop,
            AttestBadChunk: self.attest_bad,
            AttestWithheld: self.attest_withheld,
        }

    def prepare(self, node: VirtualNode, name: str, effect: PrepareVersion) -> None:
        m = effect.manifest
        node.store.setdefault(MANIFESTS, {})[m.id] = m
        present = frozenset(node.store.get(CHUNKS, {}).get(m.id, {}))
        node.swarm.loop.after(1000, _submit, node, node.epoch, VersionPrepared(m.id, present))

    def request(self, node: VirtualNode, name: str, effect: RequestChunk) -> None:
        swarm = node.swarm
        server = swarm.node_of(effect.peer)
        node.bytes_sent += _REQUEST_BYTES
        swarm.metrics.add_bytes("ChunkRequest", _REQUEST_BYTES)
        if server is None or not server.up or not swarm.net.reachable(node.index, server.index):
            failed = ChunkFailed(effect.peer, effect.manifest_id, effect.index, "unreachable")
            swarm.loop.after(REQUEST_TIMEOUT_MS * 1000, _submit, node, node.epoch, failed)
            return
        self._watch_stream(node, server)
        manifest = node.store.get(MANIFESTS, {}).get(effect.manifest_id)
        arrivals = swarm.net.transfer(node.index, server.index, _REQUEST_BYTES, swarm.loop.now_us)
        for at in arrivals[:1]:
            ask = ChunkRequested(node.peer_id, effect.manifest_id, effect.index)
            swarm.loop.at(at, _asked, server, server.epoch, node.peer_id, manifest, ask)

    def _watch_stream(self, node: VirtualNode, server: VirtualNode) -> None:
        """Our chunk stream to ``server``: if it crashes with our requests open, we learn it
        as the daemon does from a reset stream, after the transport's crash detection."""
        key = (node.index, server.index)
        if key not in self.watched:
            self.watched.add(key)
            delay = node.swarm.transport.crash_detect_us
            node.swarm.loop.after(delay, self._check_stream, node, node.epoch, server, server.epoch)

    def _check_stream(
        self, node: VirtualNode, epoch: int, server: VirtualNode, server_epoch: int
    ) -> None:
        key = (node.index, server.index)
        if node.epoch != epoch or not node.up:
            self.watched.discard(key)
            return
        if server.epoch != server_epoch or not server.up:
            self.watched.discard(key)
            node.submit(NAME, PeerDisconnected(server.peer_id))
            return
        slot = node.slots.get(NAME)
        machine: Any = None if slot is None else slot.machine
        machine = machine.inner if isinstance(machine, Wrapped) else machine
        if machine is not None and any(
            server.peer_id in t.in_flight.values() for t in machine.transfers.values()
        ):
            delay = node.swarm.transport.crash_detect_us
            node.swarm.loop.after(delay, self._check_stream, node, epoch, server, server_epoch)
        else:
            self.watched.discard(key)

    def serve(self, node: VirtualNode, name: str, effect: ServeChunk) -> None:
        held = node.store.get(CHUNKS, {}).get(effect.manifest_id, {})
        digest = held.get(effect.index)
        manifest = node.store.get(MANIFESTS, {}).get(effect.manifest_id)
        if digest is None or manifest is None:
            node.swarm.metrics.count("relay.serve_unheld")
            return
        size = manifest.chunk_span(effect.index)[1] + _HEADER_BYTES
        self.sender.enqueue(node, effect.peer, (effect.manifest_id, effect.index, digest, size))

    def refuse(self, node: VirtualNode, name: str, effect: RefuseChunk) -> None:
        swarm = node.swarm
        target = swarm.node_of(effect.peer)
        node.bytes_sent += _HEADER_BYTES
        if target is None or not target.up or not swarm.net.reachable(node.index, target.index):
            return
        now = swarm.loop.now_us
        for at in swarm.net.transfer(node.index, target.index, _HEADER_BYTES, now)[:1]:
            failed = ChunkFailed(
                node.peer_id, effect.manifest_id, effect.index, "refused", effect.status
            )
            swarm.loop.at(at, _submit, target, target.epoch, failed)

    def store_chunk(self, node: VirtualNode, name: str, effect: StoreChunk) -> None:
        digest = node.store.setdefault(_ARRIVED, {}).pop((effect.manifest_id, effect.index), None)
        if digest is not None:
            held = node.store.setdefault(CHUNKS, {}).setdefault(effect.manifest_id, {})
            held[effect.index] = digest
            attestations_of(node).stored(effect.manifest_id, effect.peer)

    def discard(self, node: VirtualNode, name: str, effect: DiscardChunk) -> None:
        node.store.setdefault(_ARRIVED, {}).pop((effect.manifest_id, effect.index), None)

    def complete(self, node: VirtualNode, name: str, effect: VersionComplete) -> None:
        node.swarm.metrics.count("relay.version_complete")
        self._attest(node, attestations_of(node).completed(effect.manifest.id))
        if self.on_complete is not None:
            self.on_complete(node, effect.manifest)

    def drop(self, node: VirtualNode, name: str, effect: DropVersion) -> None:
        node.store.get(CHUNKS, {}).pop(effect.manifest_id, None)
        attestations_of(node).dropped(effect.manifest_id)

    def attest_bad(self, node: VirtualNode, name: str, effect: AttestBadChunk) -> None:
        node.swarm.metrics.count("relay.bad_chunk_attested")
        self._attest(node, attestations_of(node).bad_chunk(effect))


    def attest_withheld(self, node: VirtualNode, name: str, effect: AttestWithheld) -> None:
        node.swarm.metrics.count("relay.withheld_attested")
        self._attest(node, attestations_of(node).withheld(effect))


def attestations_of(node: VirtualNode) -> RelayAttestations:
    """The node's relay attestation tally; like the daemon's, it does not survive a restart."""
    epoch, tally = node.store.get(_ATTESTATIONS, (None, None))
    if epoch != node.epoch or tally is None:
        tally = RelayAttestations(node.peer_id)
        node.store[_ATTESTATIONS] = (node.epoch, tally)
    return tally


def _attest(node: VirtualNode, attestations: list[LedgerAttest]) -> None:
    """Relay attestations go to the node's ledger machine, if it hosts one (as the daemon's)."""
    for attestation in attestations:
        node.swarm.metrics.count(f"relay_attest.{attestation.kind.value}")
        if "ledger" in node.slots:
            node.submit("ledger", attestation)


def publish(node: VirtualNode, manifest: Manifest, published: Published) -> None:
    """The publisher holds every chunk of ``manifest`` and announces it."""
    node.store.setdefault(MANIFESTS, {})[manifest.id] = manifest
    node.store.setdefault(CHUNKS, {})[manifest.id] = dict(enumerate(manifest.chunk_hashes))
    published.add(manifest)
    node.submit(NAME, PublishVersion(manifest))


class BulkSender:
    """Each node's outgoing chunk streams share its uplink one chunk at a time, taking the
    destinations in turn (round robin), as concurrent TCP streams share a link fairly at
    chunk granularity: N children of one node each get a chunk every N chunk times. A chunk
    travels as a bulk stream (``Network.stream``): a receiver fed by several senders at once
    (the striped plan) shares its downlink between them."""

    def __init__(self, published: Published) -> None:
        self.published = published
        #: node index -> (epoch, destination peer -> queued chunks, turn order, busy)
        self.queues: dict[
            int, tuple[int, dict[str, deque[tuple[bytes, int, bytes, int]]], deque[str], list[bool]]
        ] = {}

    def enqueue(self, node: VirtualNode, peer: str, item: tuple[bytes, int, bytes, int]) -> None:
        """Queue chunk ``item`` = (manifest id, index, digest, size) for ``peer``."""
        state = self.queues.get(node.index)
        if state is None or state[0] != node.epoch:
            state = self.queues[node.index] = (node.epoch, {}, deque(), [False])
        _, queues, turns, busy = state
        if peer not in queues or not queues[peer]:
            queues.setdefault(peer, deque())
            turns.append(peer)
        queues[peer].append(item)
        if not busy[0]:
            self._dispatch(node, node.epoch)

    def _dispatch(self, node: VirtualNode, epoch: int) -> None:
        state = self.queues.get(node.index)
        if state is None or state[0] != epoch or node.epoch != epoch or not node.up:
            self.queues.pop(node.index, None)
            return
        _, queues, turns, busy = state
        swarm = node.swarm
        while turns:
            peer = turns.popleft()
            queue = queues[peer]
            mid, index, digest, size = queue.popleft()
            if queue:
                turns.append(peer)
            node.bytes_sent += size
            swarm.metrics.add_bytes("chunk", size)
            target = swarm.node_of(peer)
            if target is None or not target.up or not swarm.net.reachable(node.index, target.index):
                continue
            now = swarm.loop.now_us
            for at in swarm.net.stream(node.index, target.index, size, now)[:1]:
                got = ChunkReceived(node.peer_id, mid, index, digest)
                swarm.loop.at(at, _receive, target, target.epoch, got, size, self.published)
            busy[0] = True
            swarm.loop.at(max(now, swarm.net.up_free_us(node.index)), self._dispatch, node, epoch)
            return
        busy[0] = False


def _asked(
    server: VirtualNode, epoch: int, peer: str, manifest: Manifest | None, ask: ChunkRequested
) -> None:
    """A chunk stream opens with the manifest frame, then the request (node/relay/streams.py)."""
    if server.epoch != epoch or not server.up:
        return
    slot = server.slots.get(NAME)
    if manifest is not None and slot is not None:
        machine: Any = slot.machine.inner if isinstance(slot.machine, Wrapped) else slot.machine
        if manifest.id not in machine.transfers:
            server.deliver(peer, manifest.message, None)
    server.submit(NAME, ask)


def _submit(node: VirtualNode, epoch: int, event: object) -> None:
    if node.epoch == epoch and node.up:
        node.submit(NAME, event)


def _receive(
    node: VirtualNode, epoch: int, event: ChunkReceived, size: int, published: Published
) -> None:
    if node.epoch != epoch or not node.up:
        return
    node.bytes_received += size
    if (event.manifest_id, event.index, event.digest) not in published.chunks:
        node.swarm.metrics.count("relay.unpublished_delivery")
    node.store.setdefault(_ARRIVED, {})[(event.manifest_id, event.index)] = event.digest
    node.submit(NAME, event)
