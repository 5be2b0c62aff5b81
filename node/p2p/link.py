"""A network link's shape (:class:`LinkSpec`) and the pure schedule that applies it.

Nothing here does I/O or reads a clock: times come in as arguments (seconds of any monotonic
clock) and randomness from a ``random.Random`` the caller gives, so the schedule is tested
with an injected clock. ``node/p2p/shaping.py`` drives it under every TCP connection.

The spec string
---------------
Comma-separated ``key=value`` parts, e.g. ``rtt=60ms,up=20mbit,loss=0.5%``:

* ``rtt``: round-trip time (``ms`` or ``s``); each direction is delayed by ``rtt/2``;
* ``jitter``: each chunk's one-way delay varies uniformly within ``±jitter`` (``ms``/``s``);
* ``up``: the rate this node sends at; ``down`` (optional): the rate it receives at
  (``bit``, ``kbit``, ``mbit``, ``gbit`` per second, decimal as in ``tc``: 1 mbit = 10^6);
* ``loss``: the share of TCP segments lost (``%``).

An empty spec is no link: nothing is shaped. A bad part is a :class:`LinkSpecError` that
names it.

Who shapes what
---------------
Each end of a connection shapes what it sends (``rtt/2``, jitter, loss, ``up``) and caps what
it receives (``down``). So when every node runs the same spec (a shaped testnet) a round trip
between any two takes ``rtt`` and a transfer runs at ``min(sender's up, receiver's down)``;
a connection to an unshaped peer sees half the delay.

Loss, as TCP sees it
--------------------
TCP is reliable: a lost segment is not missing data but a late one. A chunk is cut into
``MSS_BYTES`` segments and each is lost with probability ``loss``. A loss with at least
``DUP_ACKS`` segments after it in the chunk is recovered by fast retransmit and costs the
chunk one more round trip; a loss nearer the chunk's end has nothing behind it to trigger
duplicate ACKs and waits for the retransmission timeout, ``max(MIN_RTO_S, rtt)``. Bytes are
delivered in order, so a late chunk holds back the ones after it (head-of-line blocking).
Not modeled: the congestion window's shrinking after a loss (the sending rate stays ``up``)
and the loss of a retransmission.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

#: payload of one TCP segment (1500-byte MTU less IPv4 and TCP headers with timestamps)
MSS_BYTES = 1448
#: duplicate ACKs that trigger a fast retransmit (RFC 5681)
DUP_ACKS = 3
#: the shortest retransmission timeout (Linux's TCP_RTO_MIN)
MIN_RTO_S = 0.2
#: a token bucket holds this many bytes when full: ten segments, TCP's initial window
BUCKET_BYTES = 10 * MSS_BYTES
#: the largest round trip or jitter a spec may ask for
MAX_DELAY_S = 60.0

_DURATION_UNITS = {"ms": 1e-3, "s": 1.0}
_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_KEYS = ("rtt", "jitter", "up", "down", "loss")
_NUMBER_UNIT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-z%]*)$")


class LinkSpecError(ValueError):
    """A link spec string is malformed; the message names the part."""


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A link's shape; see the module docstring. Rates are bits per second."""

    rtt_s: float = 0.0
    jitter_s: float = 0.0
    up_bps: float | None = None
    down_bps: float | None = None
    #: share of segments lost, 0 <= loss < 1
    loss: float = 0.0

    def __str__(self) -> str:
        parts = [f"rtt={self.rtt_s * 1e3:g}ms"]
        if self.jitter_s:
            parts.append(f"jitter={self.jitter_s * 1e3:g}ms")
        for key, bps in (("up", self.up_bps), ("down", self.down_bps)):
            if bps is not None:
                parts.append(f"{key}={bps / 1e6:g}mbit")
        if self.loss:
            parts.append(f"loss={self.loss * 100:g}%")
        return ",".join(parts)


def parse_link(spec: str) -> LinkSpec | None:
    """The :class:`LinkSpec` a spec string describes; None for an empty one (no link)."""
    if not spec.strip():
        return None
    values: dict[str, float] = {}
    for part in spec.split(","):
        key, sep, raw = (s.strip() for s in part.partition("="))
        if not sep or not key or not raw:
            raise LinkSpecError(f"link spec {spec!r}: part {part.strip()!r} is not key=value")
        if key not in _KEYS:
            raise LinkSpecError(f"link spec {spec!r}: unknown key {key!r} in {part.strip()!r} "
                                f"(known: {', '.join(_KEYS)})")
        if key in values:
            raise LinkSpecError(f"link spec {spec!r}: {key!r} is given twice")
        values[key] = _value(key, raw.lower(), f"link spec {spec!r}: part {part.strip()!r}")
    return LinkSpec(rtt_s=values.get("rtt", 0.0), jitter_s=values.get("jitter", 0.0),
                    up_bps=values.get("up"), down_bps=values.get("down"),
                    loss=values.get("loss", 0.0))


def _value(key: str, raw: str, where: str) -> float:
    """One part's value in base units (seconds, bits per second, a fraction)."""
    match = _NUMBER_UNIT.match(raw)
    if match is None:
        raise LinkSpecError(f"{where}: {raw!r} is not a number with a unit")
    number, unit = float(match.group(1)), match.group(2)
    if key in ("rtt", "jitter"):
        if unit not in _DURATION_UNITS:
            raise LinkSpecError(f"{where}: a duration needs a unit, ms or s")
        value = number * _DURATION_UNITS[unit]
        if value > MAX_DELAY_S:
            raise LinkSpecError(f"{where}: more than {MAX_DELAY_S:g} s")
        return value
    if key in ("up", "down"):
        if unit not in _RATE_UNITS:
            raise LinkSpecError(f"{where}: a rate needs a unit, one of {', '.join(_RATE_UNITS)}")
        if number <= 0:
            raise LinkSpecError(f"{where}: a rate must be above zero")
        return number * _RATE_UNITS[unit]
    if unit != "%":
        raise LinkSpecError(f"{where}: loss is a percentage, e.g. 0.5%")
    if number >= 100:
        raise LinkSpecError(f"{where}: loss must be below 100%")
    return number / 100


class TokenBucket:
    """A rate cap: ``rate`` bytes a second, bursts up to ``depth`` bytes (full at the start).

    A chunk larger than the tokens at hand goes into debt; :meth:`take` says when its last
    byte has left, and the next chunk waits behind that debt."""

    def __init__(self, rate_bytes_per_s: float, depth_bytes: int = BUCKET_BYTES) -> None:
        if rate_bytes_per_s <= 0 or depth_bytes < 0:
            raise ValueError("a token bucket needs a positive rate and a depth >= 0")
        self.rate = rate_bytes_per_s
        self.depth = float(depth_bytes)
        self._tokens = float(depth_bytes)
        self._at_s: float | None = None

    def take(self, nbytes: int, now_s: float) -> float:
        """Send ``nbytes`` at ``now_s``: the time its last byte has left the bucket."""
        if self._at_s is not None and now_s > self._at_s:
            self._tokens = min(self.depth, self._tokens + (now_s - self._at_s) * self.rate)
        if self._at_s is None or now_s > self._at_s:
            self._at_s = now_s
        self._tokens -= nbytes
        return now_s if self._tokens >= 0 else now_s - self._tokens / self.rate


@dataclass(frozen=True, slots=True)
class Leg:
    """One chunk's way over the link."""

    #: its last byte has left the sender (the sender may write the next chunk then)
    depart_at_s: float
    #: it has arrived at the receiver, after the one-way delay and any retransmission
    deliver_at_s: float
    #: segments lost on the way (each recovered by a retransmission)
    lost_segments: int


class LinkSchedule:
    """The sending direction of one connection: when each chunk leaves and arrives."""

    def __init__(self, spec: LinkSpec, rng: random.Random) -> None:
        self.spec = spec
        self._rng = rng
        self._bucket = None if spec.up_bps is None else TokenBucket(spec.up_bps / 8)
        self._delivered_at_s = -math.inf

    def send(self, nbytes: int, now_s: float) -> Leg:
        """Schedule a chunk of ``nbytes`` written at ``now_s``."""
        spec = self.spec
        depart = now_s if self._bucket is None else self._bucket.take(nbytes, now_s)
        one_way = spec.rtt_s / 2
        if spec.jitter_s:
            one_way = max(0.0, one_way + self._rng.uniform(-spec.jitter_s, spec.jitter_s))
        lost, penalty = self._losses(nbytes)
        deliver = max(self._delivered_at_s, depart + one_way + penalty)
        self._delivered_at_s = deliver
        return Leg(depart_at_s=depart, deliver_at_s=deliver, lost_segments=lost)

    def _losses(self, nbytes: int) -> tuple[int, float]:
        """Segments of the chunk lost, and the delay their retransmission adds (module doc)."""
        if not self.spec.loss:
            return 0, 0.0
        segments = max(1, math.ceil(nbytes / MSS_BYTES))
        lost = [i for i in range(segments) if self._rng.random() < self.spec.loss]
        if not lost:
            return 0, 0.0
        rtt = self.spec.rtt_s
        tail = lost[-1] >= segments - DUP_ACKS  # too few segments after it for dup ACKs
        return len(lost), max(MIN_RTO_S, rtt) if tail else rtt
