"""Per-peer misbehaviour scores and temporary bans, kept by the driver.

A penalty adds points to the peer's score; the score decays by ``PENALTY_DECAY_PER_MIN`` per
minute, so occasional faults are forgiven and a burst is not. When it reaches
``PENALTY_BAN_THRESHOLD`` the peer is banned for ``BAN_MS`` (the driver disconnects it, drops
its connections and messages and refuses dials to it) and its score starts again from zero.
Times are the driver's milliseconds, passed in.

What each kind of misbehaviour costs (``FAULT_PENALTIES``; ban at 100 points):

=============  ======  =========================================================================
kind           points  what the peer did
=============  ======  =========================================================================
bad_framing    10      a frame cut short, a length prefix that is no varint, a stream that
                       ended mid-frame
oversize       20      announced a frame (or gossip message) over the protocol's limit
stall          10      started a frame (or opened a stream) and did not finish within the
                       read deadline
undecodable    10      bytes that are no valid message (msgpack or protobuf)
invalid        10      a well-formed message that breaks a protocol rule (a machine's own
                       ``RemoteProtocolError`` carries its own cost instead)
replay         5       each identical copy of a unicast frame beyond the allowance in the window
flood          5       each message over the per-peer rate, each stream over a stream cap or
                       over the streams a peer may open per minute on one protocol (60; the
                       handshake included), each ping or identify push over its per-minute
                       budget; a gossip stream past its cap is no flood: it replaces the
                       peer's oldest (py-libp2p abandons streams without closing them)
=============  ======  =========================================================================

Gossip frames are checked before py-libp2p sees them (node/p2p/frame_checks.py): an RPC with
nothing gossipsub defines in it is undecodable, an unsigned message invalid.

So a peer that keeps sending garbage is banned after 10 bad streams, one that floods after
20 refused messages: well within seconds at the rates a stream allows. A valid request
replayed (a relay reservation, an AutoNAT dial, a handshake, a states request: only the rate
tells it from an honest one) is refused past the 60 streams a minute and banned 20 streams
later; an honest peer opens a few a minute on any of these protocols. A stall costs the read
deadline (10 s) per stream, but a peer may stall ten streams at once, and more than a cap's
worth are floods: a staller is banned at the first deadline. ``symphony bench fuzz`` measures
it for every protocol the daemon serves and every kind of attack.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

PENALTY_BAN_THRESHOLD = 100
PENALTY_DECAY_PER_MIN = 10
BAN_MS = 10 * 60_000
#: the cost of each kind of fault the transport or the driver sees (table in the module doc)
FAULT_PENALTIES = {"bad_framing": 10, "oversize": 20, "stall": 10, "undecodable": 10,
                   "invalid": 10, "replay": 5, "flood": 5}
#: Recent penalty reasons kept per peer for status.
PENALTY_REASONS_KEPT = 8
#: Peers whose penalty records are kept; beyond it banned peers' records and the lowest
#: scores are forgotten first (``PenaltyBook._make_room``).
MAX_PENALIZED_PEERS = 4096
#: Penalty records listed in status, highest scores first (``penalized_peers`` counts all).
STATUS_LISTED = 100


@dataclass
class PenaltyRecord:
    score: float = 0.0
    updated_ms: int = 0
    total: int = 0
    reasons: deque[str] = field(default_factory=lambda: deque(maxlen=PENALTY_REASONS_KEPT))


class PenaltyBook:
    def __init__(self) -> None:
        self.records: dict[str, PenaltyRecord] = {}
        self.banned_until: dict[str, int] = {}

    def add(self, peer: str, reason: str, points: int, now: int) -> bool:
        """Count a penalty; True if it has just banned the peer. A banned peer's faults (its
        frames still in flight when the ban fell) add nothing: it is refused already."""
        if self.is_banned(peer, now):
            return False
        record = self.records.get(peer)
        if record is None:
            if len(self.records) >= MAX_PENALIZED_PEERS:
                self._make_room(now)
            record = self.records[peer] = PenaltyRecord(updated_ms=now)
        record.score = self._decayed(record, now) + points
        record.updated_ms = now
        record.total += points
        record.reasons.append(reason)
        if record.score >= PENALTY_BAN_THRESHOLD:
            self._forget_expired(now)
            self.banned_until[peer] = now + BAN_MS
            record.score = 0.0
            return True
        return False

    def score(self, peer: str) -> float:
        record = self.records.get(peer)
        return 0.0 if record is None else record.score

    def is_banned(self, peer: str, now: int) -> bool:
        until = self.banned_until.get(peer)
        if until is None:
            return False
        if until <= now:
            del self.banned_until[peer]
            return False
        return True

    def banned_count(self, now: int) -> int:
        return sum(1 for u in self.banned_until.values() if u > now)

    def status(self, now: int) -> dict[str, Any]:
        """The ``STATUS_LISTED`` latest bans (seconds left) and highest scores with their
        reasons, and how many of each there are: an attacker with many keys must not make
        ``/status`` megabytes long."""
        listed = sorted(self.records.items(), key=lambda item: -item[1].score)[:STATUS_LISTED]
        bans = sorted(((u, p) for p, u in self.banned_until.items() if u > now), reverse=True)
        return {
            "penalized_peers": len(self.records),
            "penalties": {p: {"score": round(r.score, 1), "total": r.total,
                              "reasons": list(r.reasons)} for p, r in listed},
            "banned_peers": len(bans),
            "banned": {p: round((u - now) / 1000, 1) for u, p in bans[:STATUS_LISTED]},
        }

    @staticmethod
    def _decayed(record: PenaltyRecord, now: int) -> float:
        return max(0.0, record.score - (now - record.updated_ms) / 60_000 * PENALTY_DECAY_PER_MIN)

    def _make_room(self, now: int) -> None:
        """Forget an eighth of the records: banned peers' first (their bans are kept apart),
        then the lowest scores as of now. Never the peers misbehaving now: with the lowest
        stored score dropped one at a time, an attacker's fresh keys pushed out each other's
        records, so none of them ever reached a ban (seen in the fuzz bench past 4,096 keys);
        and one sort per eighth keeps a stream of new keys cheap."""
        order = sorted(self.records, key=lambda p: (self.banned_until.get(p, 0) <= now,
                                                    self._decayed(self.records[p], now)))
        for peer in order[: max(1, len(order) // 8)]:
            del self.records[peer]

    def _forget_expired(self, now: int) -> None:
        """Drop the bans that have run out (a banned key that never returns is not looked up
        again, so without this each would be kept for the life of the process)."""
        for peer in [p for p, u in self.banned_until.items() if u <= now]:
            del self.banned_until[peer]
