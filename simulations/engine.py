"""The discrete-event loop: ``(time_us, seq, callback, args)`` events in time order, nothing else.

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

Events wait in a calendar queue: buckets of ``BUCKET_US`` microseconds (a dict of unsorted
lists) under a heap of bucket numbers; a bucket is sorted once when its turn comes, and an
event scheduled into the bucket being run goes on a small heap of its own beside it (``_late``),
and the loop takes whichever of the two comes first. A big swarm keeps ~10^5 events in flight,
and a heap of them cost ~17 tuple comparisons (cache misses) per event; inserting into the
sorted bucket instead moved every event after the insertion point, thousands per insert in a
bucket of a 100,000-node flood.

The loop knows nothing of networks or machines; simulations/transport.py, gossip.py and
node.py schedule their callbacks on it.
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

_gc_depth = 0


@contextmanager
def fewer_gc_passes() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while a simulation builds and runs.

    A swarm allocates millions of long-lived objects (every node's machine state) and almost
    no reference cycles (a full ``symphony bench simulate`` run leaves none), yet the collector
    walks them again and again: about a sixth of a 10,000-node run with the default thresholds,
    still ~8% with a young threshold of 50,000. Inside the context automatic collection is off
    and what exists when it opens is frozen; garbage is still freed by reference counting, and
    cycles, if any, are collected after the context closes. Nothing a simulation computes
    depends on when. Re-entrant: the outermost context decides.
    """
    global _gc_depth
    _gc_depth += 1
    if _gc_depth > 1:
        try:
            yield
        finally:
            _gc_depth -= 1
        return
    was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        # what the run made joins the oldest generation without being walked now
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()
        _gc_depth -= 1


#: width of a calendar bucket, as a shift: 2**10 us (about a millisecond)
BUCKET_SHIFT = 10

_Event = tuple[int, int, Callback, tuple[Any, ...]]


class EventLoop:
    """A seeded-by-construction, single-threaded discrete-event scheduler."""

    __slots__ = (
        "_buckets",
        "_keys",
        "_current",
        "_current_key",
        "_pos",
        "_late",
        "_seq",
        "now_us",
        "events_run",
        "_stopped",
        "_until_us",
        "_inline",
    )

    def __init__(self) -> None:
        self._buckets: dict[int, list[_Event]] = {}  # bucket number -> its events, unsorted
        self._keys: list[int] = []  # heap of the bucket numbers in _buckets
        self._current: list[_Event] = []  # the bucket being run, sorted; done up to _pos
        self._current_key = -1
        self._pos = 0
        #: heap of the events scheduled into the bucket being run after it was sorted
        self._late: list[_Event] = []
        self._seq = 0
        self.now_us = 0
        self.events_run = 0
        self._stopped = False
        self._until_us = -1  # the running ``run``'s end (-1: not running)
        self._inline = 0  # steps taken by ``advance`` (counted as events)

    @property
    def now_ms(self) -> int:
        return self.now_us // US_PER_MS

    def at(self, time_us: int, callback: Callback, *args: Any) -> None:
        """Run ``callback(*args)`` at virtual time ``time_us``."""
        if time_us < self.now_us:
            raise LocalProtocolError(f"cannot schedule at {time_us} us, before now ({self.now_us})")
        self._seq += 1
        self._put((time_us, self._seq, callback, args))

    def after(self, delay_us: int, callback: Callback, *args: Any) -> None:
        """Run ``callback(*args)`` ``delay_us`` microseconds from now."""
        if delay_us < 0:
            raise LocalProtocolError(f"negative delay {delay_us} us")
        self._seq += 1
        self._put((self.now_us + delay_us, self._seq, callback, args))

    def _put(self, event: _Event) -> None:
        key = event[0] >> BUCKET_SHIFT
        if key == self._current_key:
            # sorts after every event already run (its time is >= now, its seq the largest)
            heapq.heappush(self._late, event)
            return
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [event]
            heapq.heappush(self._keys, key)
        else:
            bucket.append(event)

    def pending(self) -> int:
        return (
            len(self._current) - self._pos + len(self._late)
            + sum(len(b) for b in self._buckets.values())
        )

    def next_time_us(self) -> int | None:
        late = self._late
        if self._pos < len(self._current):
            t = self._current[self._pos][0]
            return min(t, late[0][0]) if late else t
        if late:
            return late[0][0]
        if self._keys:
            return min(self._buckets[self._keys[0]])[0]
        return None

    def horizon_us(self) -> int:
        """A time before which nothing is queued and the running ``run`` has not ended: a
        callback may ``advance`` the clock to any time below it and act there, as if an
        event had been queued for that time (the simulated transport delivers a flood's
        arrivals this way, one after the other, without queueing each)."""
        if self._stopped:
            return self.now_us
        late = self._late
        if self._pos < len(self._current):
            t = self._current[self._pos][0]
            if late and late[0][0] < t:
                t = late[0][0]
        elif late:
            t = late[0][0]
        elif self._keys:
            t = self._keys[0] << BUCKET_SHIFT
        else:
            return self._until_us + 1
        return t if t <= self._until_us else self._until_us + 1

    def advance(self, time_us: int) -> None:
        """Move the clock to ``time_us`` (at or after now, before ``horizon_us()``) inside a
        callback; counts as one event."""
        if not self.now_us <= time_us < self.horizon_us():
            raise LocalProtocolError(f"cannot advance to {time_us} us: not before the horizon")
        self.now_us = time_us
        self._inline += 1

    def try_advance(self, time_us: int) -> bool:
        """``advance(time_us)`` if ``time_us`` is before ``horizon_us()`` (True), else nothing
        (False): the one check a caller stepping through arrivals makes per arrival."""
        if self._stopped or time_us < self.now_us:
            return False
        pos = self._pos
        current = self._current
        if pos < len(current):
            if time_us >= current[pos][0]:
                return False
        elif self._keys:
            if time_us >= self._keys[0] << BUCKET_SHIFT:
                return False
        late = self._late
        if late and time_us >= late[0][0]:
            return False
        if time_us > self._until_us:
            return False
        self.now_us = time_us
        self._inline += 1
        return True

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
        keys = self._keys
        buckets = self._buckets
        pop = heapq.heappop
        current = self._current
        pos = self._pos
        late = self._late  # (one list for the loop's life: pushed to and popped in place)
        ran = 0
        self._stopped = False
        self._until_us = until_us
        inline = self._inline
        while True:
            if pos < len(current) or late:
                # the sooner of the sorted bucket's next event and the late heap's first
                if pos < len(current) and not (late and late[0] < current[pos]):
                    event = current[pos]
                    if event[0] > until_us:
                        break
                    pos += 1
                    self._pos = pos
                else:
                    event = late[0]
                    if event[0] > until_us:
                        break
                    pop(late)
                time_us, _, callback, args = event
                self.now_us = time_us
                callback(*args)
                ran += 1
                if self._stopped:
                    break
                if on_progress is not None and ran % progress_every == 0:
                    on_progress(time_us)
                continue
            if not keys or keys[0] << BUCKET_SHIFT > until_us:
                break
            key = pop(keys)
            current = buckets.pop(key)
            current.sort()  # (time, seq) are unique: callbacks are never compared
            self._current = current
            self._current_key = key
            pos = self._pos = 0
        if not self._stopped and self.now_us < until_us:
            self.now_us = until_us
        self._until_us = -1
        ran += self._inline - inline
        self.events_run += ran
        return ran
