"""The discrete-event loop: a heap of ``(time_us, seq, callback, args)``, nothing else.

Contract
--------
* Virtual time is an integer number of microseconds (``now_us``); machines see integer
  milliseconds (``now_ms``). Integers keep every run bit-for-bit reproducible.
* Events that fall due at the same microsecond run in the order they were scheduled (the
  ``seq`` counter breaks ties), so a run depends only on its inputs and its seed, never on
  dict order, hash randomization or the host's speed.
* Scheduling in the past is a bug (``LocalProtocolError``): a callback can only schedule at
  ``now_us`` or later.
* ``run(until_us)`` processes events up to and including ``until_us`` and leaves the clock
  there; events later than that stay queued for the next ``run``.

The loop knows nothing of networks or machines; simulations/transport.py and
simulations/node.py schedule their callbacks on it.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from protocol.errors import LocalProtocolError

US_PER_MS = 1000
US_PER_S = 1_000_000

Callback = Callable[..., None]

#: allocations between young-generation garbage collections while a simulation runs
GC_YOUNG_THRESHOLD = 50_000
_gc_depth = 0


@contextmanager
def fewer_gc_passes(young: int = GC_YOUNG_THRESHOLD) -> Iterator[None]:
    """Run CPython's cyclic garbage collector less often while a simulation builds and runs.

    A swarm allocates millions of long-lived objects (every node's machine state) and almost
    no reference cycles, and with the default thresholds the collector walks them again and
    again (about a sixth of a 10,000-node run). Inside the context, what exists when it opens
    is frozen (never walked) and young collections wait for ``young`` allocations. Garbage is
    still freed by reference counting and cycles are still collected, only later; nothing a
    simulation computes depends on when. Re-entrant: the outermost context decides.
    """
    global _gc_depth
    _gc_depth += 1
    if _gc_depth > 1:
        try:
            yield
        finally:
            _gc_depth -= 1
        return
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
        _gc_depth -= 1


class EventLoop:
    """A seeded-by-construction, single-threaded discrete-event scheduler."""

    __slots__ = ("_heap", "_seq", "now_us", "events_run", "_stopped")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Callback, tuple[Any, ...]]] = []
        self._seq = 0
        self.now_us = 0
        self.events_run = 0
        self._stopped = False

    @property
    def now_ms(self) -> int:
        return self.now_us // US_PER_MS

    def at(self, time_us: int, callback: Callback, *args: Any) -> None:
        """Run ``callback(*args)`` at virtual time ``time_us``."""
        if time_us < self.now_us:
            raise LocalProtocolError(f"cannot schedule at {time_us} us, before now ({self.now_us})")
        self._seq += 1
        heapq.heappush(self._heap, (time_us, self._seq, callback, args))

    def after(self, delay_us: int, callback: Callback, *args: Any) -> None:
        """Run ``callback(*args)`` ``delay_us`` microseconds from now."""
        if delay_us < 0:
            raise LocalProtocolError(f"negative delay {delay_us} us")
        self._seq += 1
        heapq.heappush(self._heap, (self.now_us + delay_us, self._seq, callback, args))

    def pending(self) -> int:
        return len(self._heap)

    def next_time_us(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def stop(self) -> None:
        """Make the current ``run`` return after the event being processed."""
        self._stopped = True

    def run(
        self,
        until_us: int,
        *,
        on_progress: Callable[[int], None] | None = None,
        progress_every: int = 50_000,
    ) -> int:
        """Process every event due at or before ``until_us``; return how many ran.

        ``on_progress(now_us)`` is called every ``progress_every`` events (for a progress bar).
        """
        heap = self._heap
        pop = heapq.heappop
        ran = 0
        self._stopped = False
        while heap and heap[0][0] <= until_us:
            time_us, _, callback, args = pop(heap)
            self.now_us = time_us
            callback(*args)
            ran += 1
            if self._stopped:
                break
            if on_progress is not None and ran % progress_every == 0:
                on_progress(time_us)
        if not self._stopped and self.now_us < until_us:
            self.now_us = until_us
        self.events_run += ran
        return ran
