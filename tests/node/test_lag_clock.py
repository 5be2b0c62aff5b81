"""Read deadlines in the loop's own time (node/p2p/lag.py): a spell in which this process was
starved of CPU is not charged to the peer as a stall; a peer that sends nothing still is.
Time is trio's MockClock: a jump is a spell in which the loop did not run."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
import trio
import trio.testing

from node.p2p.lag import HARD_FACTOR, LagClock

BUDGET_S = 1.0
STARVED_S = 5.0  # longer than the budget, shorter than the hard deadline
assert BUDGET_S < STARVED_S < BUDGET_S * HARD_FACTOR


async def _read_after_starving(clock: trio.testing.MockClock,
                               deadline: Callable[[float], AbstractContextManager[Any]],
                               ) -> bytes | None:
    """A request read under ``deadline`` (None: it raised TooSlowError, a stall); the loop
    starves for STARVED_S with the peer's bytes sent in time but not yet read, then runs on
    and delivers them."""
    send, receive = trio.open_memory_channel[bytes](1)

    async def starve() -> None:
        await trio.testing.wait_all_tasks_blocked()  # the read is waiting
        clock.jump(STARVED_S)  # the loop did not run for this long ...
        await trio.lowlevel.checkpoint()  # ... then runs: deadlines are looked at first
        await send.send(b"request")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(starve)
        try:
            with deadline(BUDGET_S):
                return await receive.receive()
        except trio.TooSlowError:
            return None


def test_a_starved_loop_charges_no_stall_where_a_plain_deadline_did() -> None:
    async def main(clock: trio.testing.MockClock) -> None:
        lag = LagClock()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lag.run)
            await trio.testing.wait_all_tasks_blocked()
            assert await _read_after_starving(clock, lag.fail_after) == b"request"
            assert lag.lag_s >= STARVED_S - 1
            # what the request read used to do: a stall charged to the peer
            assert await _read_after_starving(clock, trio.fail_after) is None
            nursery.cancel_scope.cancel()

    clock = trio.testing.MockClock()
    trio.run(main, clock, clock=clock)


def test_an_idle_clock_does_not_tick() -> None:
    async def main(clock: trio.testing.MockClock) -> None:
        lag = LagClock()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lag.run)
            await trio.testing.wait_all_tasks_blocked()
            clock.jump(STARVED_S)  # a ticking clock would find this spell and count it as lag
            await trio.testing.wait_all_tasks_blocked()
            assert lag.lag_s == 0.0
            # a deadline watched wakes it: starved spells count again
            assert await _read_after_starving(clock, lag.fail_after) == b"request"
            assert lag.lag_s >= STARVED_S - 1
            nursery.cancel_scope.cancel()

    clock = trio.testing.MockClock()
    trio.run(main, clock, clock=clock)


def test_a_peer_that_sends_nothing_still_stalls_within_the_budget() -> None:
    async def main() -> None:
        lag = LagClock()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lag.run)
            start = trio.current_time()
            with pytest.raises(trio.TooSlowError), lag.fail_after(BUDGET_S):
                await trio.sleep_forever()  # nothing ever comes
            assert BUDGET_S <= trio.current_time() - start < BUDGET_S + 0.5
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_hard_deadline_holds_when_the_clock_does_not_run() -> None:
    async def main() -> None:
        start = trio.current_time()
        with pytest.raises(trio.TooSlowError), LagClock().fail_after(BUDGET_S):
            await trio.sleep_forever()
        assert trio.current_time() - start == pytest.approx(BUDGET_S * HARD_FACTOR)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
