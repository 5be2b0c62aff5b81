"""The fetching half of the relay machine: which chunk to request from whom, and when a source
has failed.

Contract
--------
* ``RelayFetcher`` is mixed into protocol/relay/machine.py's ``RelayMachine``, which sets the
  attributes declared here. For a FETCHING transfer it keeps at most ``window`` chunk requests
  in flight, lowest index first, to one source: the plan parent, or after a failure the next of
  ``plan.sources_for`` (the re-attach rule).
* A chunk from the peer it was asked of whose digest matches the manifest is stored
  (``StoreChunk``) and served to its waiters; any other chunk is discarded, and a mismatch also
  penalizes and attests its sender and drops it as a source for that version for good.
* A failed request, a disconnect, or a source silent for ``stall_timeout_ms`` with requests in
  flight drops the source; once every source has failed, all but the bad ones are retried after
  ``retry_ms``. Progress is gossiped ``PROGRESS_REPORTS`` times per version and on completion,
  which emits ``VersionComplete``.
"""

from __future__ import annotations

import heapq

from protocol.machine import Effect, Penalize, Publish
from protocol.relay.events import (
    AttestBadChunk,
    ChunkReceived,
    DiscardChunk,
    RequestChunk,
    StoreChunk,
    VersionComplete,
)
from protocol.relay.manifest import RELAY_TOPIC, RelayProgress
from protocol.relay.transfer import Transfer, TransferState, manifest_event

BAD_CHUNK_PENALTY = 50
#: a receiver gossips its progress this many times per version (and on completion)
PROGRESS_REPORTS = 8


class RelayFetcher:
    """The fetching half of ``RelayMachine`` (see the module docstring)."""

    self_id: str
    window: int
    stall_timeout_ms: int
    retry_ms: int
    transfers: dict[bytes, Transfer]

    def _gc(self, key: tuple[str, str], out: list[Effect]) -> None:
        raise NotImplementedError

    def _on_chunk(self, ev: ChunkReceived, now: int, out: list[Effect]) -> None:
        t = self.transfers.get(ev.manifest_id)
        if (
            t is None
            or t.state is not TransferState.FETCHING
            or t.in_flight.get(ev.index) != ev.peer
        ):
            out.append(DiscardChunk(ev.peer, ev.manifest_id, ev.index))
            return
        expected = t.manifest.chunk_hashes[ev.index]
        if ev.digest != expected:
            out.append(DiscardChunk(ev.peer, ev.manifest_id, ev.index))
            out.append(Penalize(ev.peer, f"bad relay chunk {ev.index}", BAD_CHUNK_PENALTY))
            out.append(AttestBadChunk(ev.peer, ev.manifest_id, ev.index, expected, ev.digest))
            self._fail_source(t, ev.peer, "bad chunk", True, now, out)
            return
        del t.in_flight[ev.index]
        out.append(StoreChunk(ev.peer, ev.manifest_id, ev.index))
        t.last_progress_ms = now
        t.mark_present(t.by_hash[expected], out)
        self._after_progress(t, now, out)

    def _after_progress(self, t: Transfer, now: int, out: list[Effect]) -> None:
        step = max(1, t.manifest.chunks // PROGRESS_REPORTS)
        if t.complete or t.have_count >= t.reported + step:
            t.reported = t.have_count
            out.append(
                Publish(
                    RELAY_TOPIC, RelayProgress(manifest_id=t.manifest.id, chunks_held=t.have_count)
                )
            )
        if t.complete:
            t.move_to(TransferState.COMPLETE)
            t.in_flight.clear()
            t.retry_at_ms = None
            out.append(VersionComplete(t.manifest))
            out.append(manifest_event("complete", t.manifest))
            self._gc(t.manifest.key, out)
        else:
            self._pump(t, now, out)

    def _pump(self, t: Transfer, now: int, out: list[Effect]) -> None:
        """Top up the in-flight window from the current source, choosing one if needed."""
        if t.state is not TransferState.FETCHING:
            return
        if t.source is None:
            sources = t.plan.sources_for(self.self_id, set(t.failed) | {self.self_id})
            if not sources:
                if t.retry_at_ms is None:
                    t.retry_at_ms = now + self.retry_ms
                    out.append(manifest_event("no_source", t.manifest))
                return
            t.source = sources[0]
            t.last_progress_ms = now
            if t.plan.parent.get(self.self_id) != t.source:
                out.append(manifest_event("reattached", t.manifest, source=t.source))
        while len(t.in_flight) < self.window and t.pending:
            index = heapq.heappop(t.pending)
            if t.have[index] or index in t.in_flight:
                continue
            t.in_flight[index] = t.source
            out.append(RequestChunk(t.source, t.manifest.id, index))

    def _fail_source(
        self, t: Transfer, peer: str, reason: str, permanent: bool, now: int, out: list[Effect]
    ) -> None:
        t.failed[peer] = permanent or t.failed.get(peer, False)
        for index, source in list(t.in_flight.items()):
            if source == peer:
                del t.in_flight[index]
                heapq.heappush(t.pending, index)
        if t.source == peer:
            t.source = None
        out.append(manifest_event("source_failed", t.manifest, peer=peer, reason=reason))
        self._pump(t, now, out)

    def _on_tick(self, now: int, out: list[Effect]) -> None:
        for t in list(self.transfers.values()):
            if t.state is not TransferState.FETCHING:
                continue
            if t.in_flight and now >= t.last_progress_ms + self.stall_timeout_ms:
                stalled = t.source or next(iter(t.in_flight.values()))
                self._fail_source(t, stalled, "stalled", False, now, out)
            if t.retry_at_ms is not None and now >= t.retry_at_ms:
                t.retry_at_ms = None
                t.failed = {p: bad for p, bad in t.failed.items() if bad}
                self._pump(t, now, out)
