"""The relay machine: which chunk to pull from whom, and what to serve to whom. Sans-IO.

Contract
--------
One ``RelayMachine`` per node handles every artifact version it hears of. It never sees chunk
bytes: the driver moves bytes over bulk streams, hashes what arrives, and reports the digest;
chunks are ``(manifest_id, index)`` and sizes are ints, so the simulator can run it with a
bandwidth model.

* Manifests (``Received`` of a ``RelayManifest``: gossiped, sent by the plan parent, or
  opening a chunk stream) are verified; one whose signer is not trusted, a replay (same id) or a stale one (a version not
  above the newest accepted for its ``(signer, name)``) is ignored. A newer version supersedes
  an unfinished older one. A node plans and fetches a version when it is a recipient in the
  manifest or asked for that artifact (``FetchVersion``); otherwise it only remembers it,
  unplanned, and the manifests kept are capped per signer and in all, a flood penalized
  (protocol/relay/admission.py). An
  accepted manifest is also sent (``Send``) to our children in the plan: that is how
  recipients learn of it, as the publisher gossips it only once they have the version
  (protocol/relay/announce.py).
* Fetching: after ``PrepareVersion`` (the driver persists the manifest, scans its store and
  answers ``VersionPrepared`` with the chunks it holds) the missing chunks (or those asked
  for: ``FetchVersion.only``) are requested in ascending order from the plan parents, or by
  a node outside the plan from every holder at once; a bad chunk costs its sender and is
  fetched elsewhere (protocol/relay/fetching.py). Twins (one name, other signers, the same
  bytes) add holders; ``ManifestQuery`` is answered with the newest complete version held
  (protocol/relay/twins.py). Serving: protocol/relay/serving.py.
* Progress: a receiver sends ``RelayProgress`` to its plan children and the publisher
  ``PROGRESS_REPORTS`` times per version and on completion (not by gossip: that costs every
  node a message per report of every other node); the machine keeps what others report
  (``Transfer.progress``) for status and for the stall rule.
* The plan is protocol/relay/striping.py's ``build_striped_plan`` with ``stripes`` trees
  (1: the single tree of protocol/relay/plan.py); every peer must use the same ``stripes``
  and ``max_fanout``.
* Completion emits ``VersionComplete`` (the hot-swap hook).

Events and effects are declared in protocol/relay/events.py; one version's state and its
legal transitions in protocol/relay/transfer.py; the fetching rules (requests, sources,
stalls, progress) in protocol/relay/fetching.py's ``ChunkFetcher``, which the machine holds
and calls with one transfer at a time. Per artifact the newest ``keep_versions`` complete
versions are kept; older ones get ``DropVersion``.
"""

from __future__ import annotations

from collections.abc import Set

from protocol.errors import LocalProtocolError
from protocol.machine import (
    Effect,
    Emit,
    Event,
    Memo,
    PeerConnected,
    PeerDisconnected,
    Penalize,
    Received,
    Send,
    Tick,
    no_memo,
)
from protocol.relay.admission import (
    MAX_MANIFESTS,
    MAX_MANIFESTS_PER_SIGNER,
    ManifestBook,
    names_recipient,
)
from protocol.relay.announce import schedule_announcement
from protocol.relay.events import (
    ChunkFailed,
    ChunkReceived,
    ChunkRequested,
    DiscardChunk,
    DropVersion,
    FetchVersion,
    PrepareVersion,
    PublishVersion,
    RefuseChunk,
    RejectVersion,
    Restore,
    StreamClosed,
    VersionPrepared,
)
from protocol.relay.fetching import ChunkFetcher
from protocol.relay.manifest import (
    ChunkStatus,
    Manifest,
    ManifestError,
    ManifestQuery,
    RelayManifest,
    RelayProgress,
    verify_manifest,
)
from protocol.relay.plan import MAX_FANOUT
from protocol.relay.serving import answer_request
from protocol.relay.striping import DEFAULT_STRIPES, MAX_STRIPES, build_striped_plan, manifest_plan
from protocol.relay.transfer import Transfer, TransferState, chunk_indices, manifest_event
from protocol.relay.twins import Wants, add_holder, find_twin, reject_content, take_held_twin, widen

DEFAULT_WINDOW = 8
KEEP_VERSIONS = 2
STALL_TIMEOUT_MS = 30_000
RETRY_MS = 1_000
MAX_QUEUED_PER_PEER = 64
BAD_MANIFEST_PENALTY = 20


class RelayMachine:
    def __init__(
        self,
        self_id: str,
        *,
        window: int = DEFAULT_WINDOW,
        keep_versions: int = KEEP_VERSIONS,
        stall_timeout_ms: int = STALL_TIMEOUT_MS,
        retry_ms: int = RETRY_MS,
        max_queued_per_peer: int = MAX_QUEUED_PER_PEER,
        max_fanout: int = MAX_FANOUT,
        stripes: int = DEFAULT_STRIPES,
        trusted: Set[str] | None = None,
        max_manifests_per_signer: int = MAX_MANIFESTS_PER_SIGNER,
        max_manifests: int = MAX_MANIFESTS,
        memo: Memo = no_memo,  # for the manifest check, plan, chunk index (protocol/machine.py)
    ) -> None:
        if window < 1 or keep_versions < 1 or max_queued_per_peer < 1:
            raise LocalProtocolError("window, keep_versions and max_queued_per_peer must be >= 1")
        if not 1 <= stripes <= MAX_STRIPES:
            raise LocalProtocolError(f"stripes must be within 1..{MAX_STRIPES}, got {stripes}")
        self.self_id = self_id
        self.keep_versions = keep_versions
        self.max_queued_per_peer = max_queued_per_peer
        self.max_fanout = max_fanout
        self.stripes = stripes
        self.trusted = None if trusted is None else frozenset(trusted)
        self.transfers: dict[bytes, Transfer] = {}
        self._latest: dict[tuple[str, str], int] = {}
        #: the artifacts this node asked for, and which of their chunks
        self.wants = Wants()
        #: valid manifests this node takes no part in (unplanned), and the caps on all kept
        self.book = ManifestBook(
            self_id, max_per_signer=max_manifests_per_signer, max_total=max_manifests
        )
        self._verify_manifest, self._chunk_indices = memo(verify_manifest), memo(chunk_indices)
        self._build_striped_plan = memo(build_striped_plan)
        #: requests, sources, stalls and progress of the transfers being fetched
        self.fetcher = ChunkFetcher(self_id, window=window, stall_timeout_ms=stall_timeout_ms,
                                    retry_ms=retry_ms)

    # ------------------------------------------------------------ queries

    def latest_complete(self, name: str, signer: str | None = None) -> Manifest | None:
        done = [t.manifest for t in self.transfers.values() if t.state is TransferState.COMPLETE
                and t.manifest.name == name and signer in (None, t.manifest.signer)]
        return max(done, key=lambda m: m.version, default=None)

    def latest_version(self, key: tuple[str, str]) -> int:
        """The newest version accepted for artifact ``(signer, name)``, 0 if none."""
        return self._latest.get(key, 0)

    def next_deadline(self) -> int | None:
        deadlines: list[int] = []
        for t in self.transfers.values():
            self.fetcher.add_deadlines(t, deadlines)
        return min(deadlines, default=None)

    # ------------------------------------------------------------ events

    def handle(self, event: Event, now: int) -> list[Effect]:
        out: list[Effect] = []
        if isinstance(event, Received) and isinstance(event.message, RelayManifest):
            self._on_manifest(event.peer, event.message, now, out)
        elif isinstance(event, ChunkReceived):
            self._on_chunk(event, now, out)
        elif isinstance(event, ChunkRequested):
            answer_request(self.transfers.get(event.manifest_id), event,
                           event.manifest_id in self.book.known, self.max_queued_per_peer, out)
        elif isinstance(event, Received) and isinstance(event.message, RelayProgress):
            t = self.transfers.get(event.message.manifest_id)
            if t is not None:
                self.fetcher.on_progress(t, event.peer, event.message, now, out)
        elif isinstance(event, ChunkFailed):
            if event.penalty > 0:
                out.append(Penalize(event.peer, event.reason, event.penalty))
            t = self.transfers.get(event.manifest_id)
            if t is not None and t.in_flight.get(event.index) == event.peer:
                self.fetcher.fail_source(t, event.peer, event.reason, False, now, out)
        elif isinstance(event, PeerDisconnected):
            self.fetcher.on_disconnected(list(self.transfers.values()), event.peer, now, out)
        elif isinstance(event, StreamClosed):
            t = self.transfers.get(event.manifest_id)
            if t is not None:
                t.forget_waiter(event.peer)
        elif isinstance(event, PeerConnected):
            self.fetcher.on_connected(self.transfers.values(), event.peer)
        elif isinstance(event, Tick):
            for t in list(self.transfers.values()):
                self.fetcher.on_tick(t, now, out)
        elif isinstance(event, VersionPrepared):
            t = self.transfers.get(event.manifest_id)
            if t is not None and t.state is TransferState.PREPARING:
                t.mark_present(event.present, out)  # serve who asked while we scanned
                t.move_to(TransferState.FETCHING)
                if self.fetcher.after_progress(t, now, out):
                    self._gc(t.manifest.key, out)
        elif isinstance(event, PublishVersion):
            self._on_publish(event.manifest, now, out)
        elif isinstance(event, FetchVersion):
            self._on_fetch(event, now, out)
        elif isinstance(event, Received) and isinstance(event.message, ManifestQuery):
            held = self.latest_complete(event.message.name)
            if held is not None:
                out.append(Send(event.peer, held.message))
        elif isinstance(event, RejectVersion):
            self._on_reject(event, out)
        elif isinstance(event, Restore):
            self._on_restore(event, now, out)
        return out

    def _on_fetch(self, event: FetchVersion, now: int, out: list[Effect]) -> None:
        self.wants.add(event, self.self_id, out)
        for t in list(self.transfers.values()):
            if not self.wants.asked(t.manifest) or t.manifest.signer == self.self_id:
                continue
            if t.state is TransferState.KNOWN:  # restored, nobody asked for it: resume it
                widen(t, event.only, fresh=True)
                t.move_to(TransferState.PREPARING)
                out.append(PrepareVersion(t.manifest))
            elif t.state in (TransferState.PREPARING, TransferState.FETCHING):
                widen(t, event.only)
                self.fetcher.pump(t, now, out)
        for m in [m for m in self.book.known.values() if self.wants.asked(m)]:
            del self.book.known[m.id]  # the newest of its artifact: older ones are gone
            if not self._join_twin(m, now, out):
                self._register(m, TransferState.PREPARING, out)
                out.append(PrepareVersion(m))

    def _join_twin(self, manifest: Manifest, now: int, out: list[Effect]) -> bool:
        """A manifest with the same content as a version held or being fetched: plan it too
        if we hold that version (we serve it), else count its signer as another source
        (protocol/relay/twins.py). Whether it had a twin."""
        twin = find_twin(self.transfers.values(), manifest)
        if twin is None:
            return False
        if twin.state is TransferState.COMPLETE:
            self._register(manifest, TransferState.PREPARING, out)
            out.append(PrepareVersion(manifest))
        else:
            self.book.known[manifest.id] = manifest  # remembered: a replay stays a replay
            if add_holder(twin, manifest.signer, self.self_id):
                out.append(manifest_event("holder", twin.manifest, holder=manifest.signer))
                self.fetcher.pump(twin, now, out)
        return True

    def _on_reject(self, event: RejectVersion, out: list[Effect]) -> None:
        t = self.transfers.get(event.manifest_id)
        if t is None:
            return
        reject_content(t, self.book.known, event.reason, self.self_id, out)
        self._abandon(t, "rejected", out)

    def _on_chunk(self, ev: ChunkReceived, now: int, out: list[Effect]) -> None:
        t = self.transfers.get(ev.manifest_id)
        if t is None:
            out.append(DiscardChunk(ev.peer, ev.manifest_id, ev.index))
        elif self.fetcher.on_chunk(t, ev, now, out):
            self._gc(t.manifest.key, out)

    def _on_manifest(self, peer: str, msg: RelayManifest, now: int, out: list[Effect]) -> None:
        try:
            manifest = self._verify_manifest(msg)
        except ManifestError as exc:
            out.append(Penalize(peer, f"invalid relay manifest: {exc}", BAD_MANIFEST_PENALTY))
            out.append(Emit("manifest_invalid", {"peer": peer, "error": str(exc)}))
            return
        for t in self.wants.answered(self.transfers.values(), manifest, peer, self.self_id):
            self.fetcher.pump(t, now, out)  # a peer we asked holds it too
        if manifest.id in self.book.known and take_held_twin(self.book.known,
                                                            self.transfers.values(), manifest):
            self._register(manifest, TransferState.PREPARING, out)  # we hold its bytes now
            out.append(PrepareVersion(manifest))
        if manifest.id in self.transfers or manifest.id in self.book.known:
            return  # a replay of a manifest we hold: nothing new
        if self.trusted is not None and manifest.signer not in self.trusted:
            out.append(manifest_event("manifest_untrusted", manifest, peer=peer))
            return
        latest = self._latest.get(manifest.key)
        if latest is not None and manifest.version <= latest:
            out.append(manifest_event("manifest_stale", manifest, peer=peer, latest=latest))
            return
        planned = (t.manifest for t in self.transfers.values())
        evicted = self.book.admit(manifest, peer, planned, out)
        if evicted is None:
            return
        for m in evicted:
            if not any(t.manifest.key == m.key for t in self.transfers.values()):
                self._latest.pop(m.key, None)
        out.append(manifest_event("manifest_accepted", manifest, peer=peer))
        recipient = names_recipient(manifest, self.self_id)
        if manifest.signer != self.self_id and not recipient and self._join_twin(manifest, now, out):
            return
        if manifest.signer == self.self_id or not (recipient or self.wants.asked(manifest)):
            self._supersede(manifest, out)
            self.book.known[manifest.id] = manifest  # no part in it: remembered, not planned
            return
        t = self._register(manifest, TransferState.PREPARING, out)
        self._push_down(t, out)
        out.append(PrepareVersion(manifest))

    def _on_publish(self, manifest: Manifest, now: int, out: list[Effect]) -> None:
        if manifest.signer != self.self_id:
            raise LocalProtocolError("can only publish a manifest this node signed")
        latest = self._latest.get(manifest.key)
        if latest is not None and manifest.version <= latest:
            raise LocalProtocolError(f"version {manifest.version} is not above {latest}")
        t = self._register(manifest, TransferState.COMPLETE, out)
        t.mark_present(frozenset(range(manifest.chunks)))
        self._push_down(t, out)
        schedule_announcement(t, now, out)  # gossip once the recipients have it
        out.append(manifest_event("published", manifest, chunks=manifest.chunks))
        self._gc(manifest.key, out)

    def _on_restore(self, event: Restore, now: int, out: list[Effect]) -> None:
        manifest = event.manifest
        if manifest.id in self.transfers:
            return
        latest = self._latest.get(manifest.key, 0)
        t = self._register(manifest, TransferState.KNOWN, out)
        t.mark_present(event.present)
        if t.complete:
            t.move_to(TransferState.PREPARING)
            t.move_to(TransferState.COMPLETE)
        elif (
            manifest.version > latest
            and manifest.signer != self.self_id
            and (self.self_id in t.plan or self.wants.asked(manifest))
        ):
            t.move_to(TransferState.PREPARING)
            t.move_to(TransferState.FETCHING)
            self.fetcher.pump(t, now, out)
        self._gc(manifest.key, out)

    def _register(self, manifest: Manifest, state: TransferState, out: list[Effect]) -> Transfer:
        plan = manifest_plan(manifest, stripes=self.stripes, max_fanout=self.max_fanout,
                             build=self._build_striped_plan)
        t = Transfer(manifest=manifest, plan=plan, state=state, have=bytearray(manifest.chunks))
        t.stripe_have = [0] * plan.stripes
        t.by_hash = self._chunk_indices(manifest.chunk_hashes)
        # ascending: each stripe's list is already a heap
        widen(t, self.wants.only(manifest), fresh=True)
        self._supersede(manifest, out)
        self.transfers[manifest.id] = t
        return t

    def _supersede(self, manifest: Manifest, out: list[Effect]) -> None:
        """A version newer than any of its artifact's drops the unfinished older ones."""
        key = manifest.key
        if manifest.version > self._latest.get(key, 0):
            self._latest[key] = manifest.version
            self.book.forget_key(key)
            for old in list(self.transfers.values()):
                if old.manifest.key == key and old.state in (
                    TransferState.PREPARING,
                    TransferState.FETCHING,
                    TransferState.KNOWN,
                ):
                    self._abandon(old, "superseded", out)

    def _push_down(self, t: Transfer, out: list[Effect]) -> None:
        """Send the manifest to our children in the plan: nobody waits on a lost gossip."""
        out.extend(Send(child, t.manifest.message) for child in t.plan.children_of(self.self_id))

    # ------------------------------------------------------------ lifecycle

    def _abandon(self, t: Transfer, reason: str, out: list[Effect]) -> None:
        t.move_to(TransferState.ABANDONED)
        for index, peers in t.waiting.items():
            for peer in peers:
                out.append(RefuseChunk(peer, t.manifest.id, index, ChunkStatus.GONE))
        t.waiting.clear()
        t.queued.clear()
        t.in_flight.clear()
        out.append(DropVersion(t.manifest.id, reason))
        out.append(manifest_event("dropped", t.manifest, reason=reason))
        del self.transfers[t.manifest.id]

    def _gc(self, key: tuple[str, str], out: list[Effect]) -> None:
        done = [t for t in self.transfers.values()
                if t.manifest.key == key and t.state is TransferState.COMPLETE]
        done.sort(key=lambda t: t.manifest.version)
        for t in done[: max(0, len(done) - self.keep_versions)]:
            self._abandon(t, "garbage-collected", out)
