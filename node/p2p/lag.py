"""Read deadlines that do not count the time this process was starved of CPU.

A peer whose request is not read within its deadline is charged for a stall
(node/penalties.py). But when this process is starved (a shared machine under load, a long
step that holds the trio loop), its loop falls behind: bytes the peer sent in time wait
unread, and a plain ``trio.fail_after`` expires on them and charges an honest peer.

:class:`LagClock` ticks every ``TICK_S`` and counts of the time that passed between two ticks
at most ``TICK_S + SLACK_S``; a deadline it watches runs down only by what was counted, so a
spell in which the loop did not run costs the peer at most one tick's worth. The watched
scope is cancelled by the clock's own task, which runs only when the loop does, never by trio
on waking from a starved spell. A hard deadline of ``HARD_FACTOR`` times the budget still
applies (the clock not running, a process starved without end).

With no deadline watched the clock does not tick (it waits for the next ``fail_after``): an
idle daemon's loop stays asleep, and ``lag_s`` counts only lag while a deadline is watched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

#: how often the clock ticks (s): the granularity of a watched deadline
TICK_S = 0.1
#: lateness of a tick still counted as the loop's own time (s): timer and scheduling jitter
SLACK_S = 0.05
#: a watched deadline ends at this many times its budget of wall time whatever the lag
HARD_FACTOR = 6


class LagClock:
    """Deadlines counted in time the loop ran (module doc); ``run`` it in a nursery."""

    def __init__(self) -> None:
        #: the scopes watched, and the seconds of their budget left
        self._watched: dict[trio.CancelScope, float] = {}
        #: seconds of wall time not counted so far while a deadline was watched (status, tests)
        self.lag_s = 0.0
        #: set when a deadline is watched: wakes the clock that waits with nothing to watch
        self._wanted = trio.Event()

    async def run(self) -> None:
        last = trio.current_time()
        while True:
            if not self._watched:  # nothing to run down: sleep until a deadline is watched
                self._wanted = trio.Event()
                await self._wanted.wait()
                last = trio.current_time()
            await trio.sleep(TICK_S)
            now = trio.current_time()
            counted = min(now - last, TICK_S + SLACK_S)
            self.lag_s += now - last - counted
            last = now
            self.count(counted)

    def count(self, seconds: float) -> None:
        """Run every watched deadline down by ``seconds`` of the loop's time."""
        for scope, left in list(self._watched.items()):
            if left <= seconds:
                del self._watched[scope]
                scope.cancel()
            else:
                self._watched[scope] = left - seconds

    @contextmanager
    def fail_after(self, seconds: float) -> Iterator[trio.CancelScope]:
        """``trio.fail_after(seconds)`` in the loop's time: raises ``trio.TooSlowError`` once
        ``seconds`` of it passed in the block (or ``HARD_FACTOR`` times it of wall time)."""
        scope = trio.CancelScope(deadline=trio.current_time() + seconds * HARD_FACTOR)
        self._watched[scope] = seconds
        self._wanted.set()
        try:
            with scope:
                yield scope
        finally:
            self._watched.pop(scope, None)
        if scope.cancelled_caught:
            raise trio.TooSlowError
