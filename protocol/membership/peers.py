"""What the membership machine keeps about its peers: connections and their states, address
book entries, recent drops, and the queue of per-connection timers; the redial backoff and
what a PeerList answer holds.

Contract
--------
* A connection is ``AWAITING_HELLO`` until the peer's Hello is accepted, then ``READY``;
  ``TRANSITIONS`` is the whole table (leaving either state means the connection is gone).
* :class:`TimerQueue` holds each connection's next due time, keyed by peer, so that finding
  the earliest timer, or the ones due, costs O(log n) in the connections rather than a scan
  of them on every event. Due keys come out in the order given when they were queued (the
  order connections were made), so the machine handles them as a scan would.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from enum import Enum

from protocol.membership.messages import MAX_EXCHANGED_PEERS, PeerInfo


class ConnState(Enum):
    AWAITING_HELLO = "awaiting_hello"
    READY = "ready"


#: legal transitions of a connection; leaving either state means the connection is gone.
TRANSITIONS: dict[ConnState, frozenset[ConnState]] = {
    ConnState.AWAITING_HELLO: frozenset({ConnState.READY}),
    ConnState.READY: frozenset(),
}


@dataclass(slots=True)
class Connection:
    peer: str
    state: ConnState
    connected_at_ms: int
    last_seen_ms: int
    outbound: bool
    agent_version: str = ""
    rtt_ms: int | None = None
    ping_nonce: int | None = None
    ping_sent_at_ms: int = 0
    next_ping_at_ms: int = 0
    #: the connection's place in the order connections were made (timers run in that order)
    seq: int = 0
    #: how often our Hello was sent again on this connection after a failed send
    hello_resends: int = 0


@dataclass(slots=True)
class KnownPeer:
    peer: str
    addrs: tuple[str, ...]
    bootstrap: bool = False
    failures: int = 0
    next_dial_at_ms: int = 0
    dialing: bool = False


def backoff_ms(failures: int, base_ms: int, max_ms: int, rng: random.Random) -> int:
    """How long to wait before redialling a peer after ``failures`` failures: min(base *
    2**failures, max) plus up to a quarter of it drawn from ``rng``."""
    base: int = min(base_ms * (2 ** min(failures, 20)), max_ms)
    return base + rng.randrange(base // 4 + 1)


def exchangeable(book: dict[str, KnownPeer], ready: list[str], asker: str,
                 limit: int) -> tuple[PeerInfo, ...]:
    """What we tell ``asker`` in a PeerList: up to ``limit`` (at most MAX_EXCHANGED_PEERS) of
    our ``ready`` peers but the asker that told us addresses to dial them at."""
    infos = [PeerInfo(peer_id=p, addrs=book[p].addrs)
             for p in ready if p != asker and p in book and book[p].addrs]
    return tuple(infos[: min(limit, MAX_EXCHANGED_PEERS)])


@dataclass(frozen=True, slots=True)
class Drop:
    peer: str
    reason: str
    at_ms: int


class TimerQueue:
    """Each key's next due time (at most one per key); entries a later ``set`` or a
    ``discard`` replaced stay in the heap and are skipped when they reach its top."""

    __slots__ = ("_heap", "_queued")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str]] = []  # (due at ms, order, key)
        self._queued: dict[str, tuple[int, int]] = {}  # key -> (due at ms, order)

    def set(self, key: str, order: int, at_ms: int | None) -> None:
        """``key`` is next due at ``at_ms`` (None: not at all)."""
        if at_ms is None:
            self._queued.pop(key, None)
            return
        if self._queued.get(key) != (at_ms, order):
            self._queued[key] = (at_ms, order)
            heapq.heappush(self._heap, (at_ms, order, key))

    def discard(self, key: str) -> None:
        self._queued.pop(key, None)

    def first(self) -> int | None:
        """The earliest due time queued, or None."""
        heap = self._heap
        while heap and self._queued.get(heap[0][2]) != heap[0][:2]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_due(self, now_ms: int) -> list[str]:
        """The keys due at ``now_ms``, no longer queued, in their ``order``."""
        heap = self._heap
        due: list[tuple[int, str]] = []
        while heap and heap[0][0] <= now_ms:
            at_ms, order, key = heapq.heappop(heap)
            if self._queued.get(key) == (at_ms, order):
                del self._queued[key]
                due.append((order, key))
        due.sort()
        return [key for _, key in due]
