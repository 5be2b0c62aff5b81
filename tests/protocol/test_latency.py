"""An executor's latency estimate: learned overhead that ages, reservations counted by their odds."""

from __future__ import annotations

import pytest

from protocol.envelopes import open_envelope
from protocol.errors import LocalProtocolError
from protocol.machine import Tick
from protocol.market.events import ComputeDone
from protocol.market.latency import (
    OVERHEAD_HALF_LIFE_MS,
    WIN_GAIN,
    Ahead,
    LatencyModel,
)
from protocol.market.messages import BID_DOMAIN, Bid, BidBody
from tests.protocol.executor_net import assign, beacon, executor, sends, spec

HALF = OVERHEAD_HALF_LIFE_MS


def estimate(bid: Bid) -> int:
    return open_envelope(bid.envelope, BID_DOMAIN, BidBody, 1 << 20).est_latency_ms


def test_first_measurement_is_taken_outright_then_averaged() -> None:
    m = LatencyModel()
    m.task_done(tokens=10, compute_ms=1_100, tokens_per_s=100.0, now=0)
    assert m.overhead_at(0) == pytest.approx(1_000)  # beyond 10 tokens at 100 tokens/s
    m.task_done(tokens=0, compute_ms=2_000, tokens_per_s=100.0, now=0)
    assert m.overhead_at(0) == pytest.approx(1_300)


@pytest.mark.parametrize("age,weight", [(0, 1.0), (HALF, 0.5), (2 * HALF, 0.25)])
def test_a_learned_overhead_halves_every_half_life(age: int, weight: float) -> None:
    m = LatencyModel()
    m.task_done(tokens=0, compute_ms=8_000, tokens_per_s=100.0, now=1_000)
    assert m.overhead_at(1_000 + age) == pytest.approx(8_000 * weight)


def test_a_new_measurement_averages_with_the_aged_overhead() -> None:
    m = LatencyModel()
    m.task_done(tokens=0, compute_ms=1_000, tokens_per_s=100.0, now=0)
    m.task_done(tokens=0, compute_ms=1_000, tokens_per_s=100.0, now=HALF)
    assert m.overhead_at(HALF) == pytest.approx(500 + 0.3 * 500)


def test_estimate_counts_reservations_at_the_share_won() -> None:
    m = LatencyModel()
    m.reservation_ended(won=False)
    assert m.win_share == pytest.approx(1 - WIN_GAIN)
    m.win_share = 0.5
    # 100 tokens at 100 tokens/s; ahead: 1 running, 1 queued, 2 reserved at 0.5, on 2 slots
    assert m.estimate_ms(100, 100.0, Ahead(running=1, queued=1, reserved=2, slots=2), 0) \
        == 1_000 * (1 + 3 / 2)


def test_half_life_must_be_positive() -> None:
    with pytest.raises(LocalProtocolError, match="half_life_ms"):
        LatencyModel(half_life_ms=0)


def test_an_executor_slowed_once_bids_again_once_that_measurement_has_aged() -> None:
    ex = executor()
    ex.handle(beacon(), 0)
    ex.handle(assign(), 1)
    # one task took 100 s (an overloaded machine): a 60 s task is declined as too slow ...
    ex.handle(ComputeDone(task_id=spec().task_id, attempt=0, answer="4", cot="c", confidence=1.0,
                          tokens=0, compute_ms=100_000, model_hash=b""), 2)
    assert not sends(ex.handle(beacon(task_id=b"\x08" * 32), 3), Bid)
    assert ex.counters["beacon_skipped.too_slow"] == 1
    # ... but not forever: with no task run, nothing else would ever correct the estimate
    (bid,) = sends(ex.handle(beacon(task_id=b"\x09" * 32), 2 + 2 * HALF), Bid)
    assert estimate(bid) == 2_560 + 25_000  # 256 tokens at 100/s, a quarter of the 100 s


def test_reservations_that_lose_their_auction_do_not_count_as_whole_tasks_ahead() -> None:
    ex = executor(queue=4)
    now = 0
    for batch in range(2):  # ten bids, none of which was assigned
        for i in range(5):
            assert sends(ex.handle(beacon(task_id=bytes([batch * 5 + i + 1]) * 32), now), Bid)
        now += 5_000
        ex.handle(Tick(), now)
    share = (1 - WIN_GAIN) ** 10
    assert ex.latency.win_share == pytest.approx(share)
    run = b"\x20" * 32
    ex.handle(beacon(task_id=run), now)
    ex.handle(assign(spec(task_id=run)), now)  # won: the share moves toward 1
    share += WIN_GAIN * (1 - share)
    for i in range(3):
        ex.handle(beacon(task_id=bytes([0x30 + i]) * 32), now)
    # one running and three reserved ahead: counted whole, 2,560 ms x 5 = 12.8 s > 10 s
    (bid,) = sends(ex.handle(beacon(task_id=b"\x40" * 32, deadline_ms=10_000), now), Bid)
    assert estimate(bid) == round(2_560 * (1 + 1 + 3 * share))
