"""The upload bandwidth a node has shown it can sustain, measured on its chunk streams.

``UploadMeter.sent(n, now)`` is told of every piece of chunk bytes written (node/relay/streams.py);
a *busy window* is at least ``WINDOW_S`` seconds of sending with no pause over ``GAP_S``, and
``best_bps`` is the fastest such window so far (bytes/s; 0 until one has been seen). It only
rises, and only by more than ``STEP`` of itself, so the capability record that carries it
(node/ledger/service.py) is not re-signed for every small change. It is a lower bound on the
uplink: a node sends only as fast as its children ask.
"""

from __future__ import annotations

WINDOW_S = 2.0
GAP_S = 0.5
#: a new best replaces the old one only if it is this much faster (relative)
STEP = 0.1


class UploadMeter:
    def __init__(self) -> None:
        self.best_bps = 0
        self._start = 0.0
        self._last: float | None = None
        self._bytes = 0

    def sent(self, n: int, now: float) -> None:
        if self._last is None or now - self._last > GAP_S:
            self._start, self._bytes = now, 0
        self._bytes += n
        self._last = now
        span = now - self._start
        if span >= WINDOW_S:
            rate = int(self._bytes / span)
            if rate > self.best_bps * (1 + STEP):
                self.best_bps = rate
            self._start, self._bytes = now, 0
