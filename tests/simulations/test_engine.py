"""The event loop: time order, FIFO among equal times, no scheduling into the past."""

from __future__ import annotations

import pytest

from protocol.errors import LocalProtocolError
from simulations.engine import EventLoop


def test_events_run_in_time_order_and_fifo_at_equal_times() -> None:
    loop = EventLoop()
    order: list[str] = []
    loop.at(30, order.append, "c")
    loop.at(10, order.append, "a1")
    loop.at(10, order.append, "a2")
    loop.after(20, order.append, "b")
    assert loop.run(100) == 4
    assert order == ["a1", "a2", "b", "c"]
    assert loop.now_us == 100


def test_run_stops_at_until_and_keeps_later_events() -> None:
    loop = EventLoop()
    seen: list[int] = []
    for t in (5, 15, 25):
        loop.at(t, seen.append, t)
    loop.run(15)
    assert seen == [5, 15] and loop.pending() == 1 and loop.next_time_us() == 25
    loop.run(30)
    assert seen == [5, 15, 25]


def test_callbacks_can_schedule_more_events() -> None:
    loop = EventLoop()
    seen: list[int] = []

    def chain(n: int) -> None:
        seen.append(loop.now_us)
        if n:
            loop.after(7, chain, n - 1)

    loop.at(0, chain, 3)
    loop.run(1000)
    assert seen == [0, 7, 14, 21]


def test_scheduling_in_the_past_is_a_local_error() -> None:
    loop = EventLoop()
    loop.run(50)
    with pytest.raises(LocalProtocolError):
        loop.at(10, lambda: None)
    with pytest.raises(LocalProtocolError):
        loop.after(-1, lambda: None)


def test_stop_returns_after_the_current_event() -> None:
    loop = EventLoop()
    seen: list[int] = []
    loop.at(1, seen.append, 1)
    loop.at(2, loop.stop)
    loop.at(3, seen.append, 3)
    loop.run(10)
    assert seen == [1] and loop.now_us == 2


def test_a_callback_may_advance_the_clock_up_to_the_next_queued_event() -> None:
    loop = EventLoop()
    seen: list[tuple[str, int]] = []

    def burst() -> None:
        assert loop.horizon_us() == 50  # the next queued event
        for t in (20, 30, 49):
            loop.advance(t)
            seen.append(("burst", loop.now_us))
        with pytest.raises(LocalProtocolError):
            loop.advance(50)  # not before the horizon: it must be queued
        with pytest.raises(LocalProtocolError):
            loop.advance(10)  # the past

    loop.at(10, burst)
    loop.at(50, lambda: seen.append(("queued", loop.now_us)))
    assert loop.run(100) == 5  # every advance counts as an event
    assert seen == [("burst", 20), ("burst", 30), ("burst", 49), ("queued", 50)]


def test_the_horizon_stops_at_the_end_of_the_run() -> None:
    loop = EventLoop()
    horizons: list[int] = []
    loop.at(10, lambda: horizons.append(loop.horizon_us()))
    loop.at(500, lambda: None)
    loop.run(40)
    assert horizons == [41]  # nothing queued before 500, but the run ends at 40


def test_try_advance_moves_the_clock_exactly_where_advance_may() -> None:
    loop = EventLoop()
    seen: list[tuple[int, bool]] = []

    def burst() -> None:
        # queued at 5000 (a later bucket) and at 30 (this one); the run ends at 6000
        for t in (5, 20, 29, 30, 31):
            seen.append((t, loop.try_advance(t)))
        loop.at(1200, lambda: None)
        seen.append((1199, loop.try_advance(1199)))

    def late() -> None:
        seen.append((6000, loop.try_advance(6000)))
        seen.append((6001, loop.try_advance(6001)))
        loop.stop()
        seen.append((6000, loop.try_advance(6000)))

    loop.at(10, burst)
    loop.at(30, lambda: None)
    loop.at(5000, late)
    loop.run(6000)
    assert seen == [
        (5, False),  # the past
        (20, True),
        (29, True),
        (30, False),  # an event is queued then
        (31, False),
        (1199, False),  # 30 is still queued before it
        (6000, True),  # the run's last microsecond
        (6001, False),  # after the run's end
        (6000, False),  # stopped
    ]


def test_events_scheduled_into_the_running_bucket_interleave_in_time_and_seq_order() -> None:
    """Events added to the bucket being run (a side heap) run in (time, seq) order among the
    ones it was sorted with, and the horizon and ``try_advance`` see them."""
    loop = EventLoop()
    ran: list[tuple[int, str]] = []

    def note(name: str) -> None:
        ran.append((loop.now_us, name))

    def add_late() -> None:
        note("add")
        loop.at(30, note, "late30")
        loop.at(20, note, "late20")
        loop.at(40, note, "late40-after-sorted40")
        loop.at(7, note, "late7")
        assert loop.horizon_us() == loop.next_time_us() == 7 and loop.pending() == 7
        assert not loop.try_advance(7) and loop.try_advance(6)

    for t, name in ((10, "sorted10"), (25, "sorted25"), (40, "sorted40")):
        loop.at(t, note, name)
    loop.at(5, add_late)
    loop.run(1000)
    assert ran == [(5, "add"), (7, "late7"), (10, "sorted10"), (20, "late20"), (25, "sorted25"),
                   (30, "late30"), (40, "sorted40"), (40, "late40-after-sorted40")]
    assert loop.pending() == 0
