"""The executor machine driven directly: bidding within slots, accepting only what it should."""

from __future__ import annotations

import pytest

from protocol.envelopes import open_envelope
from protocol.machine import Penalize, Received, Tick
from protocol.market.executor import (
    MATCH_ANY,
    MATCH_EXACT,
    MATCH_FAMILY,
    CancelCompute,
    ComputeDone,
    ComputeFailed,
    Executor,
    ExecutorConfig,
    ServedModel,
    StartCompute,
    match_score,
)
from protocol.market.jobs import JobState
from protocol.market.messages import (
    BID_DOMAIN,
    RESULT_DOMAIN,
    Bid,
    BidBody,
    Cancel,
    Reject,
    RejectReason,
    Requirement,
    Result,
    ResultBody,
)
from tests.protocol.executor_net import ME, REQ, TID, assign, beacon, executor, sends, spec
from tests.protocol.market_net import MODEL, ident


def test_matching_beacon_gets_a_signed_bid_holding_a_slot() -> None:
    ex = executor()
    effects = ex.handle(beacon(), 0)
    (bid,) = sends(effects, Bid)
    body = open_envelope(bid.envelope, BID_DOMAIN, BidBody, 1 << 20)
    assert body.bidder == ME.peer_id == bid.envelope.signer and body.match_score == MATCH_EXACT
    assert body.est_latency_ms == 2560  # 256 tokens at 100 tokens/s
    assert ex.free_slots() == 0 and ex.next_deadline() == body.hold_ms


@pytest.mark.parametrize("event,counter", [
    (lambda: beacon(), "beacon_duplicate"),
    (lambda: beacon(task_id=b"\x08" * 32), "beacon_skipped.no_slot"),
    (lambda: beacon(task_id=b"\x09" * 32, signer=ident(3)), "beacon_rejected.forged"),
])
def test_second_beacon_is_not_bid_on(event, counter) -> None:  # type: ignore[no-untyped-def]
    ex = executor(queue=0)
    ex.handle(beacon(), 0)
    effects = ex.handle(event(), 1)
    assert not sends(effects, Bid)
    assert ex.counters[counter] == 1


@pytest.mark.parametrize("kw,why", [
    ({"model": "llama-70b"}, "no_model"),
    ({"max_price": 0.0}, "too_cheap"),
    ({"max_tokens": 4096}, "over_limits"),
    ({"deadline_ms": 100}, "too_slow"),
])
def test_beacons_it_cannot_serve_get_no_bid(kw, why) -> None:  # type: ignore[no-untyped-def]
    model = ServedModel(MODEL.name, MODEL.family, 2048, MODEL.model_hash, 100.0, 1.0)
    ex = Executor(ME, ExecutorConfig(models=(model,)))
    assert not sends(ex.handle(beacon(**kw), 0), Bid)
    assert ex.counters[f"beacon_skipped.{why}"] == 1 and ex.free_slots() == 1


def test_a_busy_executor_queues_assignments_and_runs_them_in_deadline_order() -> None:
    ex = executor(queue=2)
    tids = [bytes([i]) * 32 for i in (1, 2, 3, 4)]
    bids = [sends(ex.handle(beacon(task_id=t), i), Bid) for i, t in enumerate(tids)]
    assert [len(b) for b in bids] == [1, 1, 1, 0]  # one slot and two queue places
    latency = [open_envelope(b[0].envelope, BID_DOMAIN, BidBody, 1 << 20).est_latency_ms
               for b in bids[:3]]
    assert latency[0] < latency[1] < latency[2]  # the wait is in the estimate
    started = [e for t, d in zip(tids[:3], (9_000, 8_000, 7_000), strict=True)
               for e in ex.handle(assign(spec(task_id=t), deadline_ms=d), 10)
               if isinstance(e, StartCompute)]
    assert [e.task.task_id for e in started] == [tids[0]]  # the others wait
    assert [j.state for j in ex.jobs.values()][:3] == [JobState.RUNNING, JobState.QUEUED,
                                                       JobState.QUEUED]
    done = ex.handle(ComputeDone(task_id=tids[0], attempt=0, answer="4", cot="c", confidence=1.0,
                                 tokens=1, compute_ms=1, model_hash=b""), 20)
    assert sends(done, Result) and [e.task.task_id for e in done
                                    if isinstance(e, StartCompute)] == [tids[2]]  # earliest due
    # a queued job whose deadline passes is refused to its requester, and the next one runs
    expired = ex.handle(Tick(), 8_010)
    (reject,) = sends(expired, Reject)
    assert reject.task_id == tids[1] and "queued" in reject.detail
    assert ex.jobs[tids[1]].state is JobState.FAILED


def test_a_tasks_measured_overhead_goes_into_later_estimates() -> None:
    ex = executor()
    ex.handle(beacon(), 0)
    ex.handle(assign(), 1)
    # 10 tokens at 100 tokens/s are 100 ms; the task took 1,100 (prompt, commitments)
    ex.handle(ComputeDone(task_id=TID, attempt=0, answer="4", cot="c", confidence=1.0, tokens=10,
                          compute_ms=1_100, model_hash=b""), 2)
    (bid,) = sends(ex.handle(beacon(task_id=b"\x08" * 32), 3), Bid)
    body = open_envelope(bid.envelope, BID_DOMAIN, BidBody, 1 << 20)
    assert body.est_latency_ms == 2560 + 1_000  # 256 tokens, plus the 1,000 ms seen


def test_reservation_expires_and_frees_the_slot() -> None:
    ex = executor(hold_ms=1_000, queue=0)
    ex.handle(beacon(), 0)
    ex.handle(Tick(), 1_000)
    assert ex.free_slots() == 1 and ex.jobs[TID].state is JobState.RELEASED
    assert sends(ex.handle(beacon(task_id=b"\x08" * 32), 1_000), Bid)  # the place is taken
    effects = ex.handle(assign(), 1_001)
    assert sends(effects, Reject)[0].reason is RejectReason.EXPIRED


def test_an_assignment_after_its_hold_lapsed_is_taken_while_a_place_is_free() -> None:
    ex = executor(hold_ms=1_000, queue=0)
    ex.handle(beacon(), 0)
    ex.handle(Tick(), 1_000)  # a loaded network delivered the assignment late
    effects = ex.handle(assign(), 1_001)
    assert not sends(effects, Reject) and [e for e in effects if isinstance(e, StartCompute)]
    assert ex.jobs[TID].state is JobState.RUNNING


def test_assignment_starts_compute_and_result_is_signed() -> None:
    ex = executor()
    ex.handle(beacon(), 0)
    effects = ex.handle(assign(), 10)
    (start,) = [e for e in effects if isinstance(e, StartCompute)]
    assert start.deadline_at_ms == 5_010 and start.model == MODEL.name
    assert ex.handle(assign(), 11) == []  # a retransmission is ignored
    effects = ex.handle(ComputeDone(task_id=TID, attempt=0, answer="4", cot="2+2=4",
                                    confidence=0.8, tokens=9, compute_ms=120,
                                    model_hash=MODEL.model_hash, fingerprints=(b"\x01" * 32,),
                                    fingerprint_root=b"\x02" * 32), 200)
    (res,) = sends(effects, Result)
    body = open_envelope(res.envelope, RESULT_DOMAIN, ResultBody, 1 << 20)
    assert (body.answer, body.tokens, body.executor) == ("4", 9, ME.peer_id)
    assert body.fingerprint_root == b"\x02" * 32 and ex.free_slots() == 1


@pytest.mark.parametrize("make,reason,penalized", [
    (lambda: assign(executor_peer=ident(5).peer_id), RejectReason.BAD_ASSIGN, False),
    (lambda: assign(signer=ident(5)), RejectReason.BAD_ASSIGN, True),
    (lambda: assign(sender=ident(5).peer_id), RejectReason.BAD_ASSIGN, True),
    (lambda: assign(task=spec(task_id=b"\x0a" * 32)), RejectReason.NOT_BID, False),
    (lambda: assign(task=spec(question="x" * 5000)), RejectReason.OVER_LIMITS, False),
    (lambda: assign(deadline_ms=11 * 60_000), RejectReason.OVER_LIMITS, False),
    (lambda: assign(model="other"), RejectReason.BAD_ASSIGN, False),
])
def test_assignments_it_must_refuse(make, reason, penalized) -> None:  # type: ignore[no-untyped-def]
    ex = executor(max_question_chars=4096)
    ex.handle(beacon(), 0)
    effects = ex.handle(make(), 5)
    assert [r.reason for r in sends(effects, Reject)] == [reason]
    assert not [e for e in effects if isinstance(e, StartCompute)]
    assert bool([e for e in effects if isinstance(e, Penalize)]) == penalized


def test_second_attempt_for_the_same_task_is_refused() -> None:
    ex = executor()
    ex.handle(beacon(), 0)
    ex.handle(assign(), 1)
    effects = ex.handle(assign(attempt=1), 2)
    assert sends(effects, Reject)[0].reason is RejectReason.DUPLICATE


def test_late_compute_sends_no_result_and_overrun_is_cancelled() -> None:
    ex = executor()
    ex.handle(beacon(), 0)
    ex.handle(assign(deadline_ms=1_000), 0)
    late = ex.handle(ComputeDone(task_id=TID, attempt=0, answer="4", cot="c", confidence=1.0,
                                 tokens=1, compute_ms=1, model_hash=b""), 1_001)
    assert not sends(late, Result) and ex.counters["results_late"] == 1
    ex2 = executor()
    ex2.handle(beacon(), 0)
    ex2.handle(assign(deadline_ms=1_000), 0)
    assert ex2.handle(Tick(), 1_500) == []
    effects = ex2.handle(Tick(), 2_000)
    assert CancelCompute(TID, 0) in effects and ex2.free_slots() == 1


def test_compute_failure_is_reported() -> None:
    ex = executor()
    ex.handle(beacon(), 0)
    ex.handle(assign(), 0)
    (rej,) = sends(ex.handle(ComputeFailed(TID, 0, "oom"), 5), Reject)
    assert rej.reason is RejectReason.COMPUTE_FAILED and ex.free_slots() == 1


def test_cancel_only_from_the_requester() -> None:
    ex = executor()
    ex.handle(beacon(), 0)
    ex.handle(assign(), 0)
    assert ex.handle(Received(ident(5).peer_id, Cancel(task_id=TID, attempt=0)), 1) == []
    effects = ex.handle(Received(REQ.peer_id, Cancel(task_id=TID, attempt=0)), 1)
    assert CancelCompute(TID, 0) in effects and ex.free_slots() == 1
    # a replan beacon for a task it already ran gets no second bid
    assert not sends(ex.handle(beacon(round_=1), 2), Bid)
    assert ex.counters["beacon_skipped.already_bid"] == 1


def test_long_cot_is_truncated_under_the_limit() -> None:
    ex = executor(max_cot_chars=100)
    ex.handle(beacon(), 0)
    ex.handle(assign(), 0)
    done = ComputeDone(task_id=TID, attempt=0, answer="4", cot="y" * 500, confidence=1.0,
                       tokens=1, compute_ms=1, model_hash=b"")
    (res,) = sends(ex.handle(done, 5), Result)
    body = open_envelope(res.envelope, RESULT_DOMAIN, ResultBody, 1 << 20)
    assert len(body.cot) == 100 and body.cot.endswith("truncated]")


@pytest.mark.parametrize("model,family,ctx,expect", [
    ("smollm2-135m", "", 0, MATCH_EXACT),
    ("SmolLM2-135M", "", 0, MATCH_EXACT),
    ("", "smollm2", 0, MATCH_FAMILY),
    ("smollm2", "", 0, MATCH_FAMILY),
    ("", "", 0, MATCH_ANY),
    ("llama", "", 0, None),
    ("smollm2-135m", "", 4096, None),
])
def test_match_score(model: str, family: str, ctx: int, expect: float | None) -> None:
    assert match_score(Requirement(model=model, family=family, min_context=ctx), MODEL) == expect
