"""The auction machine driven directly: beacons, closing, bid checks, deadlines, commands."""

from __future__ import annotations

import random

import pytest

from protocol.envelopes import open_envelope, seal
from protocol.errors import LocalProtocolError
from protocol.machine import Publish, Send, SendFailed, Tick
from protocol.market.auction import (
    Auction,
    AuctionConfig,
    AuctionOptions,
    CancelTask,
    Reward,
    TaskUpdated,
)
from protocol.market.messages import (
    ASSIGN_DOMAIN,
    BEACON_DOMAIN,
    BEACON_TOPIC,
    Assign,
    AssignBody,
    BeaconBody,
    Cancel,
)
from protocol.market.selection import Candidate, ScoreSelector
from protocol.market.state import AttemptState, TaskPhase, move_attempt, move_phase
from tests.protocol.auction_net import BIDDERS, ME, RecordingSelector, assigns, auction, bid, submit
from tests.protocol.market_net import MODEL


def test_submit_publishes_a_signed_beacon_and_sets_the_window() -> None:
    a, _ = auction(bid_window_ms=700)
    tid, effects = submit(a, now=100)
    (pub,) = [e for e in effects if isinstance(e, Publish)]
    assert pub.topic == BEACON_TOPIC and pub.message.envelope.signer == ME.peer_id
    body = open_envelope(pub.message.envelope, BEACON_DOMAIN, BeaconBody, 1 << 20)
    assert (body.task_id, body.wanted, body.bid_window_ms, body.deadline_ms) == \
        (tid, 2, 700, 20_000)
    assert a.next_deadline() == 800
    assert any(isinstance(e, TaskUpdated) for e in effects)


def test_window_is_short_for_a_short_deadline() -> None:
    a, _ = auction(bid_window_ms=5_000)
    submit(a, deadline_ms=3_000)
    assert a.next_deadline() == 1_000


def test_closes_as_soon_as_k_plus_spare_bids_are_in() -> None:
    a, _ = auction(spare_bids=1)
    tid, _ = submit(a)
    assert assigns(a.handle(bid(tid, BIDDERS[0]), 1)) == []
    assert assigns(a.handle(bid(tid, BIDDERS[1]), 2)) == []
    chosen = assigns(a.handle(bid(tid, BIDDERS[2], price=4.0), 3))
    assert len(chosen) == 2 and {c.executor for c in chosen} == \
        {BIDDERS[0].peer_id, BIDDERS[1].peer_id}  # the cheaper two
    assert a.tasks[tid].phase is TaskPhase.RUNNING
    assert set(a.tasks[tid].spares) == {BIDDERS[2].peer_id}
    assert len({c.attempt for c in chosen}) == 2


def test_closes_once_every_possible_bidder_has_bid() -> None:
    sel = RecordingSelector()
    a = Auction(ME, sel, random.Random(1), AuctionConfig(spare_bids=2, close_grace_ms=900),
                AuctionOptions(possible_bidders=lambda task: 2))
    tid, _ = submit(a)
    assert assigns(a.handle(bid(tid, BIDDERS[0]), 1)) == []
    assert len(assigns(a.handle(bid(tid, BIDDERS[1]), 2))) == 2  # nobody else could bid


def test_closes_a_grace_after_the_wanted_bids_are_in() -> None:
    a, _ = auction(spare_bids=2, close_grace_ms=150, bid_window_ms=1_500)
    tid, _ = submit(a, k=1)
    assert a.next_deadline() == 1_500
    assert assigns(a.handle(bid(tid, BIDDERS[0], latency=4_000), 100)) == []
    assert a.next_deadline() == 250  # not the whole window
    # a better bid within the grace is still taken
    assert assigns(a.handle(bid(tid, BIDDERS[1], latency=500), 200)) == []
    chosen = assigns(a.handle(Tick(), 250))
    assert [c.executor for c in chosen] == [BIDDERS[1].peer_id]


def run_ticks(a: Auction, until: int) -> list[tuple[int, object]]:
    """Tick the machine at each of its deadlines up to ``until``; (time, effect) pairs."""
    out: list[tuple[int, object]] = []
    while (at := a.next_deadline()) is not None and at <= until and a.open_tasks():
        out += [(at, e) for e in a.handle(Tick(), at)]
    return out


def beacon_times(effects: list[tuple[int, object]]) -> list[int]:
    return [t for t, e in effects if isinstance(e, Publish)]


def test_a_task_nobody_bids_on_backs_off_until_its_deadline_then_fails_saying_so() -> None:
    a, _ = auction(bid_window_ms=1_000, max_rounds=2, backoff_base_ms=1_000,
                   backoff_max_ms=8_000)
    tid, _ = submit(a)  # 20 s deadline
    effects = run_ticks(a, 30_000)
    # each bidless round doubles the wait before the next; they do not count toward
    # max_rounds: the deadline ends them (a round needs min_round_ms = 1 s of it left)
    assert beacon_times(effects) == [2_000, 5_000, 10_000, 19_000]
    (last,) = [e.snapshot.data for _, e in effects if isinstance(e, TaskUpdated)][-1:]
    assert last["phase"] == "failed"
    assert str(last["failure"]).startswith("no executor left: none bid in 5 rounds")


def test_a_bid_ends_the_backoff_and_a_failed_executor_is_replaced_at_once() -> None:
    a, _ = auction(bid_window_ms=1_000, backoff_base_ms=1_000, spare_bids=0)
    tid, _ = submit(a, k=1)
    assert beacon_times(run_ticks(a, 1_000)) == []  # round 0 closed bidless: a 1 s wait
    assert beacon_times(run_ticks(a, 2_000)) == [2_000]
    chosen = assigns(a.handle(bid(tid, BIDDERS[0], round_=1), 2_100))
    assert [c.executor for c in chosen] == [BIDDERS[0].peer_id]
    # the executor refuses: the next round opens at once, no backoff after a round with bids
    failed = a.handle(SendFailed(BIDDERS[0].peer_id, Assign(envelope=seal(
        ME, ASSIGN_DOMAIN, chosen[0])), "refused"), 2_200)
    assert [e for e in failed if isinstance(e, Publish)]


def test_no_round_is_held_when_the_ledger_shows_no_untried_executor() -> None:
    sel = RecordingSelector()
    known = [0]
    a = Auction(ME, sel, random.Random(1), AuctionConfig(bid_window_ms=1_000),
                AuctionOptions(possible_bidders=lambda task: known[0]))
    tid, _ = submit(a)
    effects = run_ticks(a, 8_000)
    assert beacon_times(effects) == []  # skipped: nobody could answer a beacon
    assert a.counters["rounds_skipped"] >= 2 and not a.tasks[tid].finished
    known[0] = 2  # an executor's record arrives: the next check opens a round
    assert beacon_times(run_ticks(a, 16_000))
    # every executor the ledger shows was tried: the task gives up at once
    a2 = Auction(ME, sel, random.Random(1), AuctionConfig(bid_window_ms=1_000, spare_bids=0),
                 AuctionOptions(possible_bidders=lambda task: 1))
    tid2, _ = submit(a2, k=1)
    (chosen,) = assigns(a2.handle(bid(tid2, BIDDERS[0]), 10))
    failed = a2.handle(SendFailed(BIDDERS[0].peer_id, Assign(envelope=seal(
        ME, ASSIGN_DOMAIN, chosen)), "refused"), 20)
    (snap,) = [e.snapshot.data for e in failed if isinstance(e, TaskUpdated)][-1:]
    assert snap["phase"] == "failed" and "was tried" in str(snap["failure"])


def test_window_deadline_closes_with_fewer_bids_and_replans_the_rest() -> None:
    a, _ = auction(bid_window_ms=1_000)
    tid, _ = submit(a)
    a.handle(bid(tid, BIDDERS[0]), 10)
    effects = a.handle(Tick(), 1_000)
    assert [c.executor for c in assigns(effects)] == [BIDDERS[0].peer_id]
    beacons = [open_envelope(e.message.envelope, BEACON_DOMAIN, BeaconBody, 1 << 20)
               for e in effects if isinstance(e, Publish)]
    assert [(b.round, b.wanted) for b in beacons] == [(1, 1)]
    # the bidder already assigned cannot take a second attempt in the new round
    assert assigns(a.handle(bid(tid, BIDDERS[0], round_=1), 1_010)) == []
    assert a.counters["bids_rejected.duplicate"] == 1


def test_assignment_deadline_from_latency_capped_by_the_task() -> None:
    a, _ = auction(spare_bids=0, assign_base_ms=1_000, assign_slack=2.0)
    tid, _ = submit(a, k=1, deadline_ms=10_000)
    (body,) = assigns(a.handle(bid(tid, latency=2_000), 5))
    assert body.deadline_ms == 5_000
    tid2, _ = submit(a, k=1, deadline_ms=10_000, now=10)
    (body2,) = assigns(a.handle(bid(tid2, latency=9_000), 20))
    assert body2.deadline_ms == 10_000 - 10


@pytest.mark.parametrize("kw,event_kw,why", [
    ({}, {"price": 9.0}, "over_budget"),
    ({"min_match": 0.6}, {"match": 0.5}, "poor_match"),
    ({}, {"round_": 3}, "late"),
])
def test_bid_checks(kw, event_kw, why) -> None:  # type: ignore[no-untyped-def]
    a, _ = auction(**kw)
    tid, _ = submit(a)
    effects = a.handle(bid(tid, **event_kw), 1)
    assert assigns(effects) == []
    assert a.counters[f"bids_rejected.{why}"] == 1 and not a.tasks[tid].bids
    # the bidder's reservation is released at once
    assert Send(BIDDERS[0].peer_id, Cancel(task_id=tid, attempt=-1)) in effects


def test_too_many_bids_per_task() -> None:
    a, _ = auction(max_bids_per_task=2, spare_bids=10)
    tid, _ = submit(a)
    for i in range(3):
        a.handle(bid(tid, BIDDERS[i]), i)
    assert a.counters["bids_rejected.too_many"] == 1 and len(a.tasks[tid].bids) == 2


def test_unreachable_executor_is_replaced_from_spares() -> None:
    a, sel = auction(spare_bids=1)
    tid, _ = submit(a, k=1)
    (first,) = assigns(a.handle(bid(tid, BIDDERS[0]), 1) + a.handle(bid(tid, BIDDERS[1]), 2))
    failed = SendFailed(first.executor, Assign(envelope=seal(ME, ASSIGN_DOMAIN, first)), "refused")
    (second,) = assigns(a.handle(failed, 3))
    assert second.executor != first.executor and second.attempt == first.attempt + 1
    assert (tid, first.executor, 0.0) in sel.observed


def test_spare_bids_expire_with_their_hold() -> None:
    a, _ = auction(spare_bids=1, max_rounds=1)
    tid, _ = submit(a, k=1)
    a.handle(bid(tid, BIDDERS[0], hold=100), 1)
    a.handle(bid(tid, BIDDERS[1], hold=100), 2)
    running = a.tasks[tid].active[0]
    body = AssignBody(task=a.tasks[tid].spec, executor=running.peer, attempt=0, round=0,
                      model=MODEL.name, deadline_ms=1)
    failed = SendFailed(running.peer, Assign(envelope=seal(ME, ASSIGN_DOMAIN, body)), "gone")
    effects = a.handle(failed, 500)  # the spare's hold ran out at 102
    assert assigns(effects) == [] and a.tasks[tid].phase is TaskPhase.FAILED


def test_cancel_and_reward_commands() -> None:
    a, sel = auction(spare_bids=0)
    tid, _ = submit(a, k=1)
    a.handle(bid(tid), 1)
    effects = a.handle(CancelTask(tid), 2)
    assert a.tasks[tid].phase is TaskPhase.FAILED and a.tasks[tid].failure == "cancelled"
    assert any(isinstance(e, Send) and isinstance(e.message, Cancel) for e in effects)
    a.handle(Reward(tid, BIDDERS[0].peer_id, 0.7), 3)
    assert sel.observed[-1] == (tid, BIDDERS[0].peer_id, 0.7)


def test_finished_tasks_are_forgotten_later() -> None:
    a, _ = auction(keep_finished_ms=1_000)
    tid, _ = submit(a, k=1)
    a.handle(CancelTask(tid), 10)
    assert a.next_deadline() == 1_010
    a.handle(Tick(), 1_010)
    assert tid not in a.tasks and a.next_deadline() is None


def test_open_task_cap() -> None:
    a, _ = auction(max_open_tasks=1)
    submit(a)
    tid, _ = submit(a)
    assert a.tasks[tid].phase is TaskPhase.FAILED


@pytest.mark.parametrize("kw", [{"answer_type": "poem"}, {"deadline_ms": 0}])
def test_local_misuse_raises(kw) -> None:  # type: ignore[no-untyped-def]
    a, _ = auction()
    with pytest.raises(LocalProtocolError):
        submit(a, **kw)


def test_transition_tables_are_enforced() -> None:
    a, _ = auction()
    tid, _ = submit(a, k=1)
    a.handle(CancelTask(tid), 1)
    with pytest.raises(LocalProtocolError):
        move_phase(a.tasks[tid], TaskPhase.RUNNING)
    a2, _ = auction(spare_bids=0)
    tid2, _ = submit(a2, k=1)
    a2.handle(bid(tid2), 1)
    attempt = a2.tasks[tid2].active[0]
    move_attempt(attempt, AttemptState.ANSWERED)
    with pytest.raises(LocalProtocolError):
        move_attempt(attempt, AttemptState.FAILED)


def test_reputation_callback_feeds_selection() -> None:
    seen: list[Candidate] = []

    class Spy(ScoreSelector):
        def select(self, task_id, candidates, n):  # type: ignore[no-untyped-def]
            seen.extend(candidates)
            return super().select(task_id, candidates, n)

    a = Auction(ME, Spy(), random.Random(1), AuctionConfig(spare_bids=0),
                AuctionOptions(reputation=lambda p: 0.9 if p == BIDDERS[0].peer_id else 0.1))
    tid, _ = submit(a, k=1)
    a.handle(bid(tid), 1)
    assert seen[0].reputation == 0.9
