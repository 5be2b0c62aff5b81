"""The weight relay in the daemon: drives protocol/relay/machine.py over bulk libp2p streams.

Contract
--------
* Manifests arrive on the ``relay`` gossip topic, by unicast from the plan parent (both routed
  by the driver) or as the first frame of a chunk stream; progress reports on the gossip
  topic. Chunk bytes never touch gossip: they go over dedicated streams (node/relay/streams.py,
  which states that wire protocol).
* Pipelining and bounded memory: bytes are written to a temporary chunk file while hashed, so a
  node holds no more than a piece per stream in memory; a chunk is stored (renamed) only when
  the machine has checked its digest against the manifest, and served to waiting children
  right then, while the next chunk is still arriving on the parent stream. Every queue is
  bounded (stream flow control is the backpressure).
* ``upload_limit_bps`` (config, for benchmarks): one token bucket shared by every outgoing
  chunk stream of this node, i.e. a capped uplink.
* Hot swap: ``on_version_complete(callback)`` runs ``callback(manifest)`` (sync or async) each
  time a version completes; ``wait_version(name)`` waits for one; ``export(manifest, path)``
  writes the artifact file.
* HTTP (under ``/relay``): see node/relay/api.py.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import trio

from node.relay.api import Publication, relay_routes
from node.relay.chunk_store import ChunkStore, ChunkStoreError, ChunkWriter
from node.relay.models import ModelPulls
from node.relay.plan_inputs import ledger_uploads, withheld_reports
from node.relay.section import RelaySection
from node.relay.streams import RelayStreams
from node.service import NodeContext, NurseryService
from protocol.ledger.events import Attest as LedgerAttest
from protocol.relay.attestations import RelayAttestations
from protocol.relay.events import (
    AttestBadChunk,
    AttestWithheld,
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
    VersionComplete,
    VersionPrepared,
)
from protocol.relay.machine import (
    MAX_QUEUED_PER_PEER,
    RelayMachine,
)
from protocol.relay.manifest import (
    RELAY_TOPIC,
    Manifest,
    ManifestQuery,
    RelayManifest,
    RelayProgress,
    make_body,
    sign_manifest,
)
from protocol.relay.recipients import plan_recipients, withholders
from protocol.relay.transfer import TransferState

VersionCallback = Callable[[Manifest], Awaitable[None] | None]


class RelayService(NurseryService):
    name: ClassVar[str] = "relay"
    message_types = (RelayManifest, RelayProgress, ManifestQuery)
    topics = (RELAY_TOPIC,)
    config_section: ClassVar[type | None] = RelaySection

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        sections = getattr(ctx.config, "sections", {})
        self.section: RelaySection = sections.get(self.name) or RelaySection()
        s = self.section
        self._machine = RelayMachine(
            ctx.identity.peer_id,
            window=s.window,
            keep_versions=s.keep_versions,
            stall_timeout_ms=s.stall_timeout_ms,
            max_queued_per_peer=MAX_QUEUED_PER_PEER,
            stripes=s.stripes,
            trusted=frozenset(s.trusted_publishers) or None,
            max_manifests_per_signer=s.max_manifests_per_signer,
            max_manifests=s.max_manifests,
        )
        self.store = ChunkStore(Path(ctx.data_dir) / "chunks")
        self.streams = RelayStreams(self, s.upload_limit_bps)
        #: verified-but-not-yet-stored chunks: (peer, manifest id, index) -> open writer
        self.pending: dict[tuple[str, bytes, int], ChunkWriter] = {}
        self._callbacks: list[VersionCallback] = []
        self._completed = trio.Event()
        #: set (and replaced) each time a chunk is stored: what a partial fetch waits on
        self.chunk_stored = trio.Event()
        #: bytes received from peers per version (manifest id), since the daemon started
        self.fetched_bytes: Counter[bytes] = Counter()
        self._restored: list[tuple[Manifest, frozenset[int]]] = []
        #: chunks each source served us, attested when a version completes
        self.attestations = RelayAttestations(ctx.identity.peer_id)
        #: models seeded, pulled and checked against their weights hash (node/relay/models.py)
        self.models = ModelPulls(self)
        self.counters = {
            "bad_chunks": 0,
            "chunks_in": 0,
            "chunks_out": 0,
            "bytes_in": 0,
            "bytes_out": 0,
        }

    @property
    def machine(self) -> RelayMachine:
        return self._machine

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        verify = self.section.verify_on_start
        for manifest in await trio.to_thread.run_sync(self.store.manifests):
            present = await trio.to_thread.run_sync(
                lambda m=manifest: self.store.present(m, verify=verify)
            )
            self._restored.append((manifest, present))
        self.streams.install()

    async def on_running(self) -> None:
        """The versions found at start go to the machine before the service reports started."""
        for manifest, present in self._restored:
            await self.ctx.submit(self.name, Restore(manifest, present))
        self._restored.clear()
        for spec in self.section.seed_models:
            self.spawn(self.models.seed, spec)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the service's nursery; a failure is logged, never fatal."""
        self.start_soon(self._guard, fn, args)

    async def _guard(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        try:
            await fn(*args)
        except Exception:
            self.ctx.log.exception("relay.task_failed", task=getattr(fn, "__name__", str(fn)))

    async def submit(self, event: object) -> None:
        await self.ctx.submit(self.name, event)

    # ------------------------------------------------------------ effects

    async def perform(self, effect: object) -> None:
        if isinstance(effect, RequestChunk):
            self.streams.request(effect.peer, effect.manifest_id, effect.index)
        elif isinstance(effect, ServeChunk):
            self.streams.serve(effect.peer, effect.manifest_id, effect.index, None)
        elif isinstance(effect, RefuseChunk):
            self.streams.serve(effect.peer, effect.manifest_id, effect.index, effect.status)
        elif isinstance(effect, StoreChunk):
            self._store_chunk(effect)
        elif isinstance(effect, DiscardChunk):
            writer = self.pending.pop((effect.peer, effect.manifest_id, effect.index), None)
            if writer is not None:
                writer.abort()
        elif isinstance(effect, PrepareVersion):
            self.spawn(self._prepare, effect.manifest)
        elif isinstance(effect, VersionComplete):
            self.streams.close_version(effect.manifest.id)
            self.spawn(self._completed_version, effect.manifest)
        elif isinstance(effect, DropVersion):
            self.streams.close_version(effect.manifest_id)
            self.attestations.dropped(effect.manifest_id)
            self.store.drop_manifest(effect.manifest_id)
            self.spawn(trio.to_thread.run_sync, self.store.collect)
        elif isinstance(effect, AttestBadChunk):
            self.counters["bad_chunks"] += 1
            self.spawn(self._attest, self.attestations.bad_chunk(effect))
            self.ctx.log.warning(
                "relay.bad_chunk",
                peer=effect.peer,
                index=effect.index,
                manifest=effect.manifest_id.hex(),
                expected=effect.expected.hex(),
                got=effect.got.hex(),
            )
        elif isinstance(effect, AttestWithheld):
            self.spawn(self._attest, self.attestations.withheld(effect))
            self.ctx.log.warning(
                "relay.withheld", peer=effect.peer, manifest=effect.manifest_id.hex()
            )
        else:
            raise NotImplementedError(f"relay cannot perform {type(effect).__name__}")

    def _store_chunk(self, effect: StoreChunk) -> None:
        writer = self.pending.pop((effect.peer, effect.manifest_id, effect.index), None)
        t = self._machine.transfers.get(effect.manifest_id)
        if writer is None or t is None:
            return
        try:
            writer.commit(t.manifest.chunk_hashes[effect.index])
        except (ChunkStoreError, OSError) as exc:  # disk trouble: fetch it again later
            self.ctx.log.error("relay.store_failed", index=effect.index, error=str(exc))
            return
        self.counters["chunks_in"] += 1
        self.counters["bytes_in"] += writer.size
        self.fetched_bytes[effect.manifest_id] += writer.size
        self.chunk_stored.set()
        self.chunk_stored = trio.Event()
        self.attestations.stored(effect.manifest_id, effect.peer)

    async def _prepare(self, manifest: Manifest) -> None:
        await trio.to_thread.run_sync(self.store.save_manifest, manifest)
        present = await trio.to_thread.run_sync(self.store.present, manifest)
        await self.submit(VersionPrepared(manifest.id, present))

    async def _attest(self, attestations: list[LedgerAttest]) -> None:
        """Record what relay peers did for us in the ledger (signed, gossiped)."""
        if "ledger" not in self.ctx.services:
            return
        for attestation in attestations:
            await self.ctx.submit("ledger", attestation)

    async def _completed_version(self, manifest: Manifest) -> None:
        await self._attest(self.attestations.completed(manifest.id))
        await self.models.check(manifest)
        self._completed.set()
        self._completed = trio.Event()
        for callback in list(self._callbacks):
            try:
                result = callback(manifest)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                self.ctx.log.exception("relay.callback_failed", name=manifest.name)

    # ------------------------------------------------------------ public API

    def on_version_complete(self, callback: VersionCallback) -> None:
        """Call ``callback(manifest)`` whenever a version completes here (the hot-swap hook)."""
        self._callbacks.append(callback)

    def latest(self, name: str, signer: str | None = None) -> Manifest | None:
        return self._machine.latest_complete(name, signer)

    def complete_version(self, name: str, version: int) -> Manifest | None:
        for t in self._machine.transfers.values():
            m = t.manifest
            if m.name == name and m.version == version and t.state is TransferState.COMPLETE:
                return m
        return None

    async def wait_version(
        self, name: str, version: int | None = None, signer: str | None = None
    ) -> Manifest:
        """Wait (bound it with a cancel scope) until ``name`` (>= ``version``) is complete."""
        while True:
            m = self.latest(name, signer)
            if m is not None and (version is None or m.version >= version):
                return m
            await self._completed.wait()

    async def publish(self, what: Publication) -> Manifest:
        """Chunk the file into the store, sign a manifest for its recipients, relay it."""
        size = what.chunk_size or self.section.chunk_size
        hashes, total = await trio.to_thread.run_sync(self.store.import_file, Path(what.path),
                                                      size)
        me = self.ctx.identity.peer_id
        version = what.version
        if version is None:
            version = self._machine.latest_version((me, what.name)) + 1
        peers = (list(what.recipients) if what.recipients is not None
                 else self.ctx.transport.connected_peers())
        body = make_body(
            name=what.name,
            version=version,
            chunk_size=size,
            chunk_hashes=hashes,
            total_size=total,
            format=what.format,
            publisher_upload_bps=self.advertised_upload_bps(),
            recipients=plan_recipients(
                peers,
                ledger_uploads(self.ctx.services, peers, self.ctx.clock()),
                withholders(withheld_reports(self.ctx.services)),
            ),
        )
        manifest = sign_manifest(self.ctx.identity, body)
        await trio.to_thread.run_sync(self.store.save_manifest, manifest)
        await self.submit(PublishVersion(manifest))
        return manifest

    def advertised_upload_bps(self) -> int:
        """The upload this node puts in its capability record and its manifests (bytes/s, 0:
        unknown): the configured ``upload_bps``, else the fastest it has sustained on its
        chunk streams (node/relay/upload_meter.py), no more than its upload cap."""
        s = self.section
        measured = self.streams.meter.best_bps
        if s.upload_limit_bps:
            measured = min(measured, s.upload_limit_bps) or s.upload_limit_bps
        return s.upload_bps or measured

    def set_upload(self, *, limit_bps: int, advertised_bps: int = 0) -> None:
        """Change the uplink cap and the advertised upload at run time (benchmarks)."""
        if limit_bps < 0 or advertised_bps < 0:
            raise ValueError("bandwidths must not be negative")
        self.section = replace(self.section, upload_limit_bps=limit_bps, upload_bps=advertised_bps)
        self.streams.limiter.bps = limit_bps

    def upload_settings(self) -> tuple[int, int]:
        """(upload_limit_bps, advertised upload_bps) in force now."""
        return self.section.upload_limit_bps, self.section.upload_bps

    async def fetch(self, name: str, signer: str | None = None) -> None:
        await self.submit(FetchVersion(name, signer))

    async def pull_model(self, model: str) -> dict[str, Any]:
        return await self.models.pull(model)

    async def export(self, manifest: Manifest, out: Path) -> None:
        await trio.to_thread.run_sync(self.store.export, manifest, Path(out))

    def status(self) -> dict[str, Any]:
        me = self.ctx.identity.peer_id
        versions = []
        for t in self._machine.transfers.values():
            m = t.manifest
            versions.append(
                {
                    "id": m.id.hex(),
                    "name": m.name,
                    "version": m.version,
                    "signer": m.signer,
                    "format": m.body.format.value,
                    "state": t.state.value,
                    "total_size": m.body.total_size,
                    "chunk_size": m.body.chunk_size,
                    "chunks": m.chunks,
                    "held": t.have_count,
                    "source": t.source,
                    "sources": {str(k): p for k, p in sorted(t.sources.items())},
                    "stripes": t.plan.stripes,
                    "parent": t.plan.trees[0].parent.get(me),
                    "parents": list(t.plan.parents_of(me)),
                    "children": list(t.plan.children_of(me)),
                    "plan_depth": t.plan.max_depth,
                    "plan_rate_bps": round(t.plan.rate_bps),
                    "served": dict(t.served),
                    "peers": dict(t.progress),
                    "failed_sources": sorted(t.failed),
                    "holders": list(t.holders),
                    "wanted": None if t.wanted is None else len(t.wanted),
                    "verified": self.models.is_verified(m),
                }
            )
        versions.sort(key=lambda v: (v["name"], v["version"]))
        return {
            "versions": versions,
            **self.counters,
            **self.streams.status(),
            "upload_limit_bps": self.section.upload_limit_bps,
            "rejected": dict(self.models.rejected),
        }

    def routes(self) -> list[Any]:
        return relay_routes(self)
