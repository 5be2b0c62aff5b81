"""Unicast intake limits per peer: floods and replays.

Two checks, each returning ``None`` for a frame to process or the fault kind
(node/penalties.py) for one to drop:

* :meth:`PeerIntake.admit` ``(peer, now_ms)``, before the frame is decoded: ``"flood"`` when
  the peer is over ``NetLimits.max_messages_per_peer_per_s`` (a token bucket of that size,
  refilled at that rate per second);
* :meth:`PeerIntake.replayed` ``(peer, frame, now_ms)``, after decoding, for message types
  that are not ``repeatable`` (protocol/codec.py): ``"replay"`` when the same bytes came from
  the peer more than ``NetLimits.replay_allowance`` times within
  ``NetLimits.replay_window_s`` (a retry stays within the allowance; a replayed signed
  message repeated a thousand times does not). Repeatable types (periodic digests, polls,
  requests for the same data) are sent verbatim again by honest peers: a ledger digest is
  the same bytes every anti-entropy round while nothing changes, so counting those as
  replays penalized honest peers; they are only rate-limited. Frames shorter than
  ``NetLimits.replay_min_bytes`` carry no signature and are only rate-limited too.

Memory is bounded: ``MAX_TRACKED_PEERS`` peers, ``MAX_DIGESTS_PER_PEER`` recent frames each,
the least recently seen forgotten first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from node.runtime.limits import NetLimits
from protocol.buckets import KeyedBuckets

MAX_TRACKED_PEERS = 4096
MAX_DIGESTS_PER_PEER = 1024


@dataclass
class _Peer:
    #: digest -> [first seen in the window at ms, copies seen in the window]
    seen: OrderedDict[bytes, list[int]] = field(default_factory=OrderedDict)


class PeerIntake:
    def __init__(self, limits: NetLimits) -> None:
        rate = limits.max_messages_per_peer_per_s
        self._buckets = KeyedBuckets(rate, rate)
        self._window_ms = int(limits.replay_window_s * 1000)
        self._allowance = limits.replay_allowance
        self._min_bytes = limits.replay_min_bytes
        self._peers: OrderedDict[str, _Peer] = OrderedDict()

    def check(self, peer: str, frame: bytes, now_ms: int) -> str | None:
        """Both checks on a frame of a type that is not repeatable."""
        return self.admit(peer, now_ms) or self.replayed(peer, frame, now_ms)

    def admit(self, peer: str, now_ms: int) -> str | None:
        return None if self._buckets.take(peer, now_ms) else "flood"

    def replayed(self, peer: str, frame: bytes, now_ms: int) -> str | None:
        if len(frame) < self._min_bytes:
            return None
        state = self._peer(peer)
        digest = hashlib.blake2b(frame, digest_size=16).digest()
        entry = state.seen.get(digest)
        if entry is None or now_ms - entry[0] > self._window_ms:
            if entry is None and len(state.seen) >= MAX_DIGESTS_PER_PEER:
                state.seen.popitem(last=False)
            state.seen[digest] = [now_ms, 1]
            state.seen.move_to_end(digest)
            return None
        entry[1] += 1
        state.seen.move_to_end(digest)
        return "replay" if entry[1] > self._allowance else None

    def _peer(self, peer: str) -> _Peer:
        state = self._peers.get(peer)
        if state is None:
            if len(self._peers) >= MAX_TRACKED_PEERS:
                self._peers.popitem(last=False)
            state = self._peers[peer] = _Peer()
        else:
            self._peers.move_to_end(peer)
        return state
