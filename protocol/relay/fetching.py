"""The fetching rules of the relay machine: which chunk to request from whom, and when a source
has failed.

Contract
--------
* ``ChunkFetcher`` is a helper object that protocol/relay/machine.py's ``RelayMachine`` holds
  and calls with one ``Transfer`` at a time; the machine owns the transfers (and drops or
  garbage-collects them), the fetcher only its own limits. For a FETCHING transfer it keeps, per stripe of the plan
  (protocol/relay/striping.py), at most ``window`` chunk requests in flight, lowest index
  first, to that stripe's source: its parent in the stripe's tree, or after a failure the next
  of that tree's ``sources_for`` (the re-attach rule).
* A chunk from the peer it was asked of whose digest matches the manifest is stored
  (``StoreChunk``) and served to its waiters; any other chunk is discarded, and a mismatch also
  penalizes and attests its sender and drops it as a source for that version for good.
* A failed request, a disconnect, or a source silent for ``stall_timeout_ms`` with requests in
  flight drops the source; once every source of a stripe has failed, all but the bad ones are
  retried after ``retry_ms``. A parent still fetching reports its progress to its children;
  while those reports advance and stay below the chunk we wait for, its silence is time it
  spends waiting on its own download and does not count against it (``stall_deadlines``).
* A plan parent dropped as stalled is reported (``AttestWithheld``) if its last progress
  report says it held the chunk we waited for (or it never reported): it was asked and sent
  nothing. If it said it did not hold that chunk yet (stuck behind a free rider of its own,
  say) it is a suspect: reported once a later report says it holds that chunk and still
  nothing arrives from it within ``stall_timeout_ms``; any chunk from it clears it.
  Children's reports are how free riders are found (protocol/relay/recipients.py turns them
  into leaf positions in the next plan).
* Progress (``RelayProgress``) goes to our children in every stripe and to the publisher when
  fetching starts (so a parent stuck from the start is known to be behind),
  ``PROGRESS_REPORTS`` times per version, on re-attaching and on completion, which also emits
  ``VersionComplete``. The publisher counts the completion reports of its recipients, and
  gossips the manifest once all have come (protocol/relay/announce.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from protocol.machine import Effect, Penalize, Send
from protocol.relay.announce import announce, count_completion
from protocol.relay.events import (
    AttestBadChunk,
    AttestWithheld,
    ChunkReceived,
    DiscardChunk,
    RequestChunk,
    StoreChunk,
    VersionComplete,
)
from protocol.relay.manifest import MAX_RECIPIENTS, RelayProgress
from protocol.relay.transfer import Transfer, TransferState, manifest_event

BAD_CHUNK_PENALTY = 50
#: a receiver gossips its progress this many times per version (and on completion)
PROGRESS_REPORTS = 16


class ChunkFetcher:
    """Requests, sources, stalls and progress of the transfers it is handed (module doc)."""

    def __init__(self, self_id: str, *, window: int, stall_timeout_ms: int, retry_ms: int) -> None:
        self.self_id = self_id
        #: chunk requests in flight per stripe
        self.window = window
        self.stall_timeout_ms = stall_timeout_ms
        self.retry_ms = retry_ms

    def on_chunk(self, t: Transfer, ev: ChunkReceived, now: int, out: list[Effect]) -> bool:
        """A chunk of ``t`` arrived: whether it completed the version."""
        if t.suspects.pop(ev.peer, None) is not None:
            t.suspect_due.pop(ev.peer, None)  # it serves what it was asked: no free rider
        if t.state is not TransferState.FETCHING or t.in_flight.get(ev.index) != ev.peer:
            out.append(DiscardChunk(ev.peer, ev.manifest_id, ev.index))
            return False
        expected = t.manifest.chunk_hashes[ev.index]
        if ev.digest != expected:
            out.append(DiscardChunk(ev.peer, ev.manifest_id, ev.index))
            out.append(Penalize(ev.peer, f"bad relay chunk {ev.index}", BAD_CHUNK_PENALTY))
            out.append(AttestBadChunk(ev.peer, ev.manifest_id, ev.index, expected, ev.digest))
            self.fail_source(t, ev.peer, "bad chunk", True, now, out)
            return False
        del t.in_flight[ev.index]
        out.append(StoreChunk(ev.peer, ev.manifest_id, ev.index))
        t.heard_at_ms[ev.peer] = now
        t.mark_present(t.by_hash[expected], out)
        return self.after_progress(t, now, out)

    def _report_progress(self, t: Transfer, out: list[Effect]) -> None:
        """Tell our children in every stripe and the publisher how far we are (never the
        same report twice: a repeated message is a replay to the receiving driver)."""
        if t.have_count == t.last_report:
            return
        t.reported = t.last_report = t.have_count
        report = RelayProgress(
            manifest_id=t.manifest.id,
            chunks_held=t.have_count,
            stripes_held=tuple(t.stripe_have),
        )
        for peer in (*t.plan.children_of(self.self_id), t.plan.root):
            if peer != self.self_id:
                out.append(Send(peer, report))

    def after_progress(self, t: Transfer, now: int, out: list[Effect]) -> bool:
        """Chunks of ``t`` were marked held: report, then complete or request more. Whether
        ``t`` is complete now (the machine then garbage-collects its artifact's versions)."""
        step = max(1, t.manifest.chunks // PROGRESS_REPORTS)
        if t.complete or t.last_report < 0 or t.have_count >= t.reported + step:
            self._report_progress(t, out)
        if t.complete:
            t.move_to(TransferState.COMPLETE)
            t.in_flight.clear()
            t.retry_at_ms = None
            out.append(VersionComplete(t.manifest))
            out.append(manifest_event("complete", t.manifest))
            return True
        self.pump(t, now, out)
        return False

    def pump(self, t: Transfer, now: int, out: list[Effect]) -> None:
        """Top up every stripe's in-flight window from its source, choosing one if needed."""
        if t.state is not TransferState.FETCHING:
            return
        if self.self_id not in t.plan:
            self._pump_spread(t, now, out)
            return
        busy = [0] * t.plan.stripes
        for index in t.in_flight:
            busy[t.plan.stripe_of(index)] += 1
        for stripe, pending in enumerate(t.pending):
            if pending and busy[stripe] < self.window:
                self._pump_stripe(t, stripe, pending, self.window - busy[stripe], now, out)

    def _pump_stripe(
        self, t: Transfer, stripe: int, pending: list[int], room: int, now: int, out: list[Effect]
    ) -> None:
        source = t.sources.get(stripe)
        if source is None:
            tree = t.plan.trees[stripe]
            sources = tree.sources_for(self.self_id, set(t.failed) | {self.self_id})
            if not sources:
                if t.retry_at_ms is None:
                    t.retry_at_ms = now + self.retry_ms
                    out.append(manifest_event("no_source", t.manifest, stripe=stripe))
                return
            source = t.sources[stripe] = sources[0]
            t.heard_at_ms[source] = max(now, t.heard_at_ms.get(source, now))
            if t.check_at_ms is None or t.check_at_ms > now + self.stall_timeout_ms:
                t.check_at_ms = now + self.stall_timeout_ms
            if tree.parent.get(self.self_id) != source:
                out.append(manifest_event("reattached", t.manifest, source=source, stripe=stripe))
                self._report_progress(t, out)
        while room > 0 and pending:
            index = heapq.heappop(pending)
            if t.have[index] or index in t.in_flight:
                continue
            t.in_flight[index] = source
            if t.check_at_ms is None:
                t.check_at_ms = now + self.stall_timeout_ms
            room -= 1
            out.append(RequestChunk(source, t.manifest.id, index))

    def _pump_spread(self, t: Transfer, now: int, out: list[Effect]) -> None:
        """A node outside the plan (a late fetcher, a model pull) has no parent to pull a
        stripe from: it asks every holder at once, the signers of twin manifests and the
        plan's nodes (deepest first; the publisher only when nobody else is in the plan),
        ``window`` requests in flight each, handing the lowest pending chunks out round-robin."""
        candidates: list[str] = []
        relays = t.plan.trees[0].sources_for(self.self_id, set(t.failed))
        if len(relays) > 1 and t.plan.root in relays:  # it feeds its recipients: busiest
            relays.remove(t.plan.root)
        for peer in (*t.holders, *relays):
            if peer not in t.failed and peer != self.self_id and peer not in candidates:
                candidates.append(peer)
        if not candidates:
            if t.retry_at_ms is None and any(t.pending):
                t.retry_at_ms = now + self.retry_ms
                out.append(manifest_event("no_source", t.manifest, stripe=-1))
            return
        room = dict.fromkeys(candidates, self.window)
        for peer in t.in_flight.values():
            if peer in room:
                room[peer] -= 1
        while any(r > 0 for r in room.values()):
            for peer in candidates:
                if room[peer] <= 0:
                    continue
                index = _pop_lowest(t)
                if index is None:
                    return
                if room[peer] == self.window:  # idle until now: its silence counts from here
                    t.heard_at_ms[peer] = max(now, t.heard_at_ms.get(peer, now))
                t.in_flight[index] = peer
                if t.check_at_ms is None:
                    t.check_at_ms = now + self.stall_timeout_ms
                room[peer] -= 1
                out.append(RequestChunk(peer, t.manifest.id, index))

    def on_disconnected(
        self, transfers: list[Transfer], peer: str, now: int, out: list[Effect]
    ) -> None:
        """``peer`` went away: forget what it waits for, and drop it as a source."""
        for t in transfers:
            t.forget_waiter(peer)
            if t.state is TransferState.FETCHING and (
                peer in t.sources.values() or peer in t.in_flight.values()
            ):
                self.fail_source(t, peer, "disconnected", False, now, out)
            elif peer in t.plan:
                t.failed.setdefault(peer, False)

    @staticmethod
    def on_connected(transfers: Iterable[Transfer], peer: str) -> None:
        """``peer`` is back: a source it failed as for a passing reason may be tried again."""
        for t in transfers:
            if t.failed.get(peer) is False:
                del t.failed[peer]

    def fail_source(
        self, t: Transfer, peer: str, reason: str, permanent: bool, now: int, out: list[Effect]
    ) -> None:
        t.failed[peer] = permanent or t.failed.get(peer, False)
        for index, source in list(t.in_flight.items()):
            if source == peer:
                del t.in_flight[index]
                heapq.heappush(t.pending[t.plan.stripe_of(index)], index)
        for stripe, source in list(t.sources.items()):
            if source == peer:
                del t.sources[stripe]
        out.append(manifest_event("source_failed", t.manifest, peer=peer, reason=reason))
        self.pump(t, now, out)

    def stall_deadlines(self, t: Transfer) -> dict[str, int]:
        """When each source with requests in flight counts as stalled.

        Silence counts from its last chunk to us (or from when it became our source). A
        source whose progress reports show it advancing and not yet past the lowest chunk we
        wait for (in that chunk's stripe) is waiting on its own download: silence then counts
        from its last such report, with one more ``stall_timeout_ms`` for its own re-attaching. A source that
        reports holding what we asked for, or reports nothing new, gets no such excuse."""
        lowest: dict[str, int] = {}
        for index, peer in t.in_flight.items():
            if index < lowest.get(peer, index + 1):
                lowest[peer] = index
        out = {}
        for peer, waiting_for in lowest.items():
            deadline = t.heard_at_ms.get(peer, 0) + self.stall_timeout_ms
            if self._behind(t, peer, waiting_for):
                excused = t.advanced_at_ms.get(peer, 0) + 2 * self.stall_timeout_ms
                deadline = max(deadline, excused)
            out[peer] = deadline
        return out

    @staticmethod
    def _behind(t: Transfer, peer: str, index: int) -> bool:
        """Whether ``peer``'s last report says it does not hold chunk ``index`` yet: per
        stripe (it fetches each stripe in order), else by its total."""
        stripes = t.stripe_progress.get(peer)
        if stripes is not None:
            return stripes[index % len(stripes)] <= index // len(stripes)
        held = t.progress.get(peer)
        return held is not None and held <= index

    def on_report(self, t: Transfer, peer: str, now: int) -> None:
        """A progress report arrived: a dropped parent that now says it holds the chunk we
        had asked it for must send it within ``stall_timeout_ms`` (our request is still
        queued there), or it is reported after all."""
        index = t.suspects.get(peer)
        if index is not None and peer not in t.suspect_due and not self._behind(t, peer, index):
            t.suspect_due[peer] = now + self.stall_timeout_ms

    def on_progress(
        self, t: Transfer, peer: str, msg: RelayProgress, now: int, out: list[Effect]
    ) -> None:
        """``peer`` reported how much of ``t`` it holds."""
        if peer in t.plan or len(t.progress) < MAX_RECIPIENTS:
            held = min(msg.chunks_held, t.manifest.chunks)
            if held > t.progress.get(peer, -1):
                t.progress[peer] = held
                t.advanced_at_ms[peer] = now
                if len(msg.stripes_held) == t.plan.stripes:
                    t.stripe_progress[peer] = msg.stripes_held
                self.on_report(t, peer, now)
                if held == t.manifest.chunks and peer in t.plan and peer != self.self_id:
                    count_completion(t, out)

    def on_tick(self, t: Transfer, now: int, out: list[Effect]) -> None:
        """Whatever of ``t`` is due: the announcement, suspects, stalls, the retry."""
        if t.announce_at_ms is not None and now >= t.announce_at_ms:
            announce(t, out)
        for peer, due in list(t.suspect_due.items()):
            if now >= due:
                del t.suspect_due[peer], t.suspects[peer]
                out.append(AttestWithheld(peer, t.manifest.id))
        if t.state is not TransferState.FETCHING:
            return
        if t.check_at_ms is not None and now >= t.check_at_ms:
            self._check_stalls(t, now, out)
        if t.retry_at_ms is not None and now >= t.retry_at_ms:
            t.retry_at_ms = None
            t.failed = {p: bad for p, bad in t.failed.items() if bad}
            self.pump(t, now, out)

    @staticmethod
    def add_deadlines(t: Transfer, due: list[int]) -> None:
        """Add to ``due`` when ``on_tick`` has something to do for ``t``."""
        due.extend(t.suspect_due.values())
        if t.announce_at_ms is not None:
            due.append(t.announce_at_ms)
        if t.state is TransferState.FETCHING:
            if t.in_flight and t.check_at_ms is not None:
                due.append(t.check_at_ms)
            if t.retry_at_ms is not None:
                due.append(t.retry_at_ms)

    def _check_stalls(self, t: Transfer, now: int, out: list[Effect]) -> None:
        """Drop (and report, if it is our plan parent) every stalled source; the next check
        is due at the earliest remaining deadline. Deadlines only move later as chunks and
        reports arrive, so checking at an earlier time than needed is all a stale one costs."""
        stalled_sources = [p for p, at in self.stall_deadlines(t).items() if now >= at]
        for stalled in stalled_sources:
            waiting_for = min(i for i, p in t.in_flight.items() if p == stalled)
            if any(tree.parent.get(self.self_id) == stalled for tree in t.plan.trees):
                if self._behind(t, stalled, waiting_for):
                    t.suspects[stalled] = waiting_for
                else:
                    out.append(AttestWithheld(stalled, t.manifest.id))
            self.fail_source(t, stalled, "stalled", False, now, out)
        if t.state is TransferState.FETCHING and t.in_flight:
            t.check_at_ms = max(now + 1, min(self.stall_deadlines(t).values()))
        else:
            t.check_at_ms = None


def _pop_lowest(t: Transfer) -> int | None:
    """The lowest pending chunk of any stripe that is neither held nor asked for, removed."""
    while True:
        heads = [(p[0], k) for k, p in enumerate(t.pending) if p]
        if not heads:
            return None
        index, stripe = min(heads)
        heapq.heappop(t.pending[stripe])
        if not t.have[index] and index not in t.in_flight:
            return index
