"""The membership machine's timer queue: one due time per key, due keys in their order."""

from __future__ import annotations

from protocol.membership.peers import TimerQueue


def test_due_keys_come_in_order_once_and_replaced_times_are_skipped() -> None:
    q = TimerQueue()
    q.set("c", 2, 100)
    q.set("a", 0, 300)
    q.set("b", 1, 100)
    q.set("a", 0, 50)  # moved earlier: the 300 entry is stale
    q.set("a", 0, 50)  # unchanged: queued once
    assert q.first() == 50
    assert q.pop_due(100) == ["a", "b", "c"]  # by order, not by time
    assert q.first() is None and q.pop_due(10_000) == []


def test_a_discarded_or_cleared_key_never_comes_due() -> None:
    q = TimerQueue()
    q.set("a", 0, 10)
    q.set("b", 1, 20)
    q.set("c", 2, 30)
    q.discard("a")
    q.set("b", 1, None)
    assert q.first() == 30
    q.set("a", 3, 5)  # the same key again, later in the order (a new connection)
    assert q.pop_due(30) == ["c", "a"]
