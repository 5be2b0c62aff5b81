"""A tiny synchronous network of RelayMachines for tests: instant delivery, FIFO, no clock.

It performs the relay effects the way node/relay/service.py does, minus the bytes: a chunk is
its index, a "store" is a set of indices per version, and a node listed in ``corrupt`` serves
wrong digests. A chunk request to a node that does not know the manifest first delivers the
manifest to it (the real service sends it as the first frame of every chunk stream).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from crypto.hashing import digest
from crypto.keys import Identity
from protocol.machine import Emit, PeerDisconnected, Penalize, Publish, Received, Send, Tick
from protocol.relay.events import (
    AttestBadChunk,
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
    ArtifactFormat,
    Manifest,
    chunk_hash,
    make_body,
    same_content,
    sign_manifest,
)

CHUNK = 4096


def identity(n: int) -> Identity:
    return Identity.from_seed(n.to_bytes(32, "big"))


def manifest_for(
    publisher: Identity,
    recipients: list[str],
    *,
    chunks: int = 12,
    version: int = 1,
    name: str = "model",
    repeat: bool = False,
    format: ArtifactFormat = ArtifactFormat.RAW,
) -> Manifest:
    data = [bytes([i % 2 if repeat else i]) * CHUNK for i in range(chunks)]
    body = make_body(
        name=name,
        version=version,
        chunk_size=CHUNK,
        chunk_hashes=[chunk_hash(d) for d in data],
        total_size=chunks * CHUNK,
        publisher_upload_bps=100,
        recipients=[(p, 100) for p in recipients],
        format=format,
    )
    return sign_manifest(publisher, body)


@dataclass
class Net:
    machines: dict[str, RelayMachine]
    stores: dict[str, dict[bytes, set[int]]] = field(default_factory=dict)
    manifests: dict[bytes, Manifest] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    log: list[tuple[str, object]] = field(default_factory=list)
    queue: deque[tuple[str, object]] = field(default_factory=deque)
    #: stop delivering once this many events ran (to kill a node mid-transfer)
    budget: int | None = None
    #: lose every gossip message (manifests must still reach everyone)
    drop_gossip: bool = False
    now: int = 0

    @classmethod
    def of(cls, ids: list[str], **machine_args: object) -> Net:
        return cls({p: RelayMachine(p, **machine_args) for p in ids})  # type: ignore[arg-type]

    def store(self, peer: str) -> dict[bytes, set[int]]:
        return self.stores.setdefault(peer, {})

    def publish(self, publisher: str, manifest: Manifest) -> None:
        self.manifests[manifest.id] = manifest
        self.store(publisher)[manifest.id] = set(range(manifest.chunks))
        self.deliver(publisher, PublishVersion(manifest))

    def deliver(self, peer: str, event: object) -> None:
        self.queue.append((peer, event))
        self.run()

    def run(self) -> None:
        while self.queue and (self.budget is None or self.budget > 0):
            if self.budget is not None:
                self.budget -= 1
            peer, event = self.queue.popleft()
            if peer in self.dead:
                continue
            for effect in self.machines[peer].handle(event, self.now):
                self.log.append((peer, effect))
                self.perform(peer, effect)

    def kill(self, victim: str) -> None:
        self.dead.add(victim)
        for peer in self.machines:
            if peer not in self.dead:
                self.queue.append((peer, PeerDisconnected(victim)))

    def tick(self, now: int) -> None:
        self.now = now
        for peer in self.machines:
            if peer not in self.dead:
                self.queue.append((peer, Tick()))
        self.run()

    def perform(self, peer: str, e: object) -> None:
        q = self.queue
        if isinstance(e, Send):
            q.append((e.peer, Received(peer, e.message)))
        elif isinstance(e, Publish):
            if self.drop_gossip:
                return
            for other in self.machines:
                if other != peer:
                    q.append((other, Received(peer, e.message, e.topic)))
        elif isinstance(e, PrepareVersion):
            self.manifests[e.manifest.id] = e.manifest
            held = set(self.store(peer).get(e.manifest.id, set()))
            for mid, indices in self.store(peer).items():  # the real store is content-addressed
                if same_content(self.manifests[mid], e.manifest):
                    held |= indices
            present = frozenset(held)
            q.append((peer, VersionPrepared(e.manifest.id, present)))
        elif isinstance(e, RequestChunk):
            if e.peer in self.dead:
                q.append((peer, ChunkFailed(e.peer, e.manifest_id, e.index, "unreachable")))
                return
            if e.manifest_id not in self.machines[e.peer].transfers:
                q.append((e.peer, Received(peer, self.manifests[e.manifest_id].message)))
            q.append((e.peer, ChunkRequested(peer, e.manifest_id, e.index)))
        elif isinstance(e, ServeChunk):
            good = self.manifests[e.manifest_id].chunk_hashes[e.index]
            sent = digest(good) if peer in self.corrupt else good
            q.append((e.peer, ChunkReceived(peer, e.manifest_id, e.index, sent)))
        elif isinstance(e, RefuseChunk):
            q.append((e.peer, ChunkFailed(peer, e.manifest_id, e.index, "refused", e.status)))
        elif isinstance(e, StoreChunk):
            self.store(peer).setdefault(e.manifest_id, set()).add(e.index)
        elif isinstance(e, DropVersion):
            self.store(peer).pop(e.manifest_id, None)
        elif not isinstance(e, (Emit, Penalize, AttestBadChunk, DiscardChunk, VersionComplete)):
            raise AssertionError(f"unexpected effect {e!r}")

    def effects(self, kind: type, peer: str | None = None) -> list:
        return [e for p, e in self.log if isinstance(e, kind) and (peer is None or p == peer)]

    def emitted(self, name: str, peer: str | None = None) -> list[Emit]:
        return [e for e in self.effects(Emit, peer) if e.event == name]

    def complete(self, manifest: Manifest) -> set[str]:
        return {
            p
            for p, e in self.log
            if isinstance(e, VersionComplete) and e.manifest.id == manifest.id
        }
