"""A valid bid that missed its window is used while the task still lacks executors.

Under load bids arrive seconds after their beacon: the requester refused them as late and
waited out a backoff for the next round while those executors held places for it, idle."""

from __future__ import annotations

from protocol.machine import Publish, Send, Tick
from protocol.market.messages import Cancel
from protocol.market.state import TaskPhase
from tests.protocol.auction_net import BIDDERS, assigns, auction, bid, submit


def test_a_bid_after_a_bidless_window_is_assigned_at_once_and_no_round_follows() -> None:
    a, _ = auction(bid_window_ms=1_500, backoff_base_ms=1_000)
    tid, _ = submit(a, k=1)
    assert not assigns(a.handle(Tick(), 1_500))  # nobody bid in time: a backoff
    assert a.tasks[tid].next_round_at_ms == 2_500
    (body,) = assigns(a.handle(bid(tid, BIDDERS[0], round_=0), 1_600))
    assert body.executor == BIDDERS[0].peer_id
    assert a.counters["late_bids_used"] == 1 and a.tasks[tid].phase is TaskPhase.RUNNING
    later = a.handle(Tick(), 2_500)
    assert not [e for e in later if isinstance(e, Publish)]  # no beacon: none is needed


def test_a_bid_from_an_earlier_round_fills_the_task_during_a_later_window() -> None:
    a, _ = auction(bid_window_ms=1_500, backoff_base_ms=1_000)
    tid, _ = submit(a, k=1)
    a.handle(Tick(), 1_500)
    a.handle(Tick(), 2_500)  # round 1's beacon
    assert a.tasks[tid].round == 1 and a.tasks[tid].phase is TaskPhase.BIDDING
    (body,) = assigns(a.handle(bid(tid, BIDDERS[1], round_=0), 2_600))
    assert body.executor == BIDDERS[1].peer_id and a.tasks[tid].needed == 0


def test_a_late_bid_for_a_task_that_has_its_executors_is_refused_and_released() -> None:
    a, _ = auction(spare_bids=0)
    tid, _ = submit(a, k=1)
    assert assigns(a.handle(bid(tid, BIDDERS[0]), 1))  # closes at once: k bids, no spare
    effects = a.handle(bid(tid, BIDDERS[1]), 2)
    assert not assigns(effects) and a.counters["bids_rejected.late"] == 1
    assert Send(BIDDERS[1].peer_id, Cancel(task_id=tid, attempt=-1)) in effects
