"""Token streaming of k=1 tasks (protocol/market/progress.py): the executor sends its growing
text as bounded, ordered progress frames; the requester takes them only from the executor it
assigned, within the bounds, penalizes anything else, and penalizes an executor whose signed
result contradicts what it streamed."""

from __future__ import annotations

import dataclasses

import pytest

from protocol.codec import decode, encode
from protocol.envelopes import seal
from protocol.machine import Emit, Penalize, Received, Tick
from protocol.market.auction import Auction
from protocol.market.events import StartCompute
from protocol.market.executor import ComputeDone
from protocol.market.messages import RESULT_DOMAIN, Reject, RejectReason, Result, ResultBody
from protocol.market.progress import (
    MAX_PROGRESS_CHARS,
    MAX_PROGRESS_FRAMES,
    MAX_PROGRESS_TOTAL,
    PENALTY_PROGRESS,
    PENALTY_STREAM_LIE,
    ComputeProgress,
    Progress,
    Streamed,
    agrees,
)
from tests.protocol.auction_net import BIDDERS, assigns, auction, bid, submit
from tests.protocol.executor_net import REQ, TID, assign, beacon, executor, sends, spec
from tests.protocol.market_net import MODEL

EXEC = BIDDERS[0]


def assigned(k: int = 1) -> tuple[Auction, bytes, int]:
    """An auction whose task (``k`` executors) is assigned, attempt 0 to ``EXEC``."""
    a, _ = auction()
    tid, _ = submit(a, k=k)
    effects = []
    for n, who in enumerate(BIDDERS[:k + 1]):
        effects += a.handle(bid(tid, who), n + 1)
    effects += a.handle(Tick(), 200)
    by_peer = {b.executor: b.attempt for b in assigns(effects)}
    assert EXEC.peer_id in by_peer
    return a, tid, by_peer[EXEC.peer_id]


def frame(tid: bytes, attempt: int, seq: int, text: str, peer: str = EXEC.peer_id) -> Received:
    msg = decode(encode(Progress(task_id=tid, attempt=attempt, seq=seq, text=text)))
    return Received(peer, msg)


def penalties(effects: list[object]) -> list[Penalize]:
    return [e for e in effects if isinstance(e, Penalize)]


def result(tid: bytes, attempt: int, cot: str) -> Received:
    body = ResultBody(task_id=tid, attempt=attempt, executor=EXEC.peer_id, answer=cot.strip(),
                      cot=cot, confidence=0.9, tokens=3, compute_ms=5,
                      model_hash=MODEL.model_hash, fingerprints=(), fingerprint_root=b"")
    return Received(EXEC.peer_id, Result(envelope=seal(EXEC, RESULT_DOMAIN, body)))


def test_frames_of_the_assigned_executor_grow_the_text_in_order() -> None:
    a, tid, att = assigned()
    assert a.progress.text(tid) is None
    assert a.handle(frame(tid, att, 0, "One, "), 300) == [Streamed(tid)]
    assert a.handle(frame(tid, att, 1, "two"), 301) == [Streamed(tid)]
    assert a.progress.text(tid) == "One, two"


@pytest.mark.parametrize("why,make", [
    ("not_assigned", lambda tid, att: frame(tid, att, 0, "x", peer=BIDDERS[3].peer_id)),
    ("not_assigned", lambda tid, att: frame(tid, att + 7, 0, "x")),
    ("not_assigned", lambda tid, att: frame(b"\x05" * 32, att, 0, "x")),
    ("out_of_order", lambda tid, att: frame(tid, att, 1, "x")),
])
def test_a_frame_nobody_asked_for_is_dropped_and_costs_its_sender(why, make) -> None:  # type: ignore[no-untyped-def]
    a, tid, att = assigned()
    msg = make(tid, att)
    (pen,) = penalties(a.handle(msg, 300))
    assert pen.peer == msg.peer and pen.points == PENALTY_PROGRESS
    assert a.progress.text(tid) is None and a.counters[f"progress_dropped.{why}"] == 1


def test_a_voted_task_takes_no_frames() -> None:
    a, tid, att = assigned(k=2)
    (pen,) = penalties(a.handle(frame(tid, att, 0, "x"), 300))
    assert pen.peer == EXEC.peer_id and a.progress.text(tid) is None


def test_frames_beyond_the_count_are_dropped_and_cost_the_executor() -> None:
    a, tid, att = assigned()
    for seq in range(MAX_PROGRESS_FRAMES):
        assert not penalties(a.handle(frame(tid, att, seq, "a"), 300))
    # a seq past the last one does not even decode; the count itself is the machine's bound
    with pytest.raises(Exception, match="seq"):
        frame(tid, att, MAX_PROGRESS_FRAMES, "a")
    assert a.progress.text(tid) == "a" * MAX_PROGRESS_FRAMES


def test_frames_beyond_the_total_bytes_are_dropped_and_cost_the_executor() -> None:
    a, tid, att = assigned()
    piece = "é" * MAX_PROGRESS_CHARS  # two UTF-8 bytes a character
    fitting = MAX_PROGRESS_TOTAL // len(piece.encode())
    for seq in range(fitting):
        assert not penalties(a.handle(frame(tid, att, seq, piece), 300))
    (pen,) = penalties(a.handle(frame(tid, att, fitting, "é"), 300))
    assert pen.points == PENALTY_PROGRESS and a.counters["progress_dropped.over_bounds"] == 1
    assert len(a.progress.text(tid) or "") == fitting * MAX_PROGRESS_CHARS


def test_a_result_that_extends_the_stream_is_not_penalized() -> None:
    a, tid, att = assigned()
    a.handle(frame(tid, att, 0, "One, two"), 300)
    effects = a.handle(result(tid, att, "One, two, three."), 400)
    assert not penalties(effects) and a.tasks[tid].finished
    # the streamed text stays for its followers (it vanishing means a restart)
    assert a.progress.text(tid) == "One, two"
    # a frame that crossed the result on the wire is dropped, without a penalty
    assert a.handle(frame(tid, att, 1, ", four"), 500) == []
    assert a.counters["progress_late"] == 1
    a.handle(Tick(), a.tasks[tid].forget_at_ms)  # ... until the finished task is forgotten
    assert a.progress.text(tid) is None and not a.progress.streams


def test_a_stream_the_signed_result_contradicts_costs_the_executor() -> None:
    a, tid, att = assigned()
    a.handle(frame(tid, att, 0, "The answer is 7"), 300)
    effects = a.handle(result(tid, att, "The answer is 42."), 400)
    (pen,) = penalties(effects)
    assert pen.peer == EXEC.peer_id and pen.points == PENALTY_STREAM_LIE
    assert a.counters["stream_lies"] == 1
    snap = a.tasks[tid]
    assert snap.finished and snap.results[EXEC.peer_id].body.cot == "The answer is 42."


def test_a_failed_executors_text_is_discarded_for_its_replacements() -> None:
    a, tid, att = assigned()
    a.handle(frame(tid, att, 0, "Four times"), 300)
    effects = a.handle(Received(EXEC.peer_id, Reject(
        task_id=tid, attempt=att, reason=RejectReason.COMPUTE_FAILED, detail="oom")), 400)
    assert Streamed(tid) in effects  # followers are woken: the text they had is gone
    (restarted,) = [e for e in effects if isinstance(e, Emit)
                    and e.event == "task.stream_restarted"]
    assert restarted.fields["discarded_chars"] == len("Four times")
    assert a.progress.text(tid) is None and a.counters["progress_restarted"] == 1
    (again,) = assigns(effects)  # the spare bidder takes over and streams from the start
    other = again.executor
    assert other != EXEC.peer_id
    assert a.handle(frame(tid, again.attempt, 0, "The answer", peer=other), 500) == [
        Streamed(tid)]
    assert a.progress.text(tid) == "The answer"  # not "Four timesThe answer"
    # a late frame of the failed attempt changes nothing
    assert a.handle(frame(tid, att, 1, " two"), 600) == []
    assert a.progress.text(tid) == "The answer"


def test_agreement_allows_for_a_truncated_cot() -> None:
    assert agrees("", "abc") and agrees("ab", "abc") and agrees("abc", "abc")
    assert not agrees("abd", "abc") and not agrees("abcd", "abc")
    assert agrees("abcdef", "abc\n[... truncated]") and not agrees("abx", "abc\n[... truncated]")


def running(k: int = 1, stream: bool = True):  # type: ignore[no-untyped-def]
    ex = executor()
    ex.handle(beacon(), 0)
    task = dataclasses.replace(spec(), k=k)
    (start,) = [e for e in ex.handle(assign(task=task, stream=stream), 1)
                if isinstance(e, StartCompute)]
    assert start.stream is stream  # the driver learns whether to follow the text at all
    return ex


def test_the_executor_sends_what_each_text_adds_in_order() -> None:
    ex = running()
    (first,) = sends(ex.handle(ComputeProgress(TID, 0, "One"), 2), Progress)
    assert (first.seq, first.text) == (0, "One")
    assert sends(ex.handle(ComputeProgress(TID, 0, "One"), 3), Progress) == []
    (second,) = sends(ex.handle(ComputeProgress(TID, 0, "One, two"), 4), Progress)
    assert (second.seq, second.text) == (1, ", two")
    # a text that no longer extends what was sent is held back: the stream stays a prefix
    assert sends(ex.handle(ComputeProgress(TID, 0, "Uno"), 5), Progress) == []
    long = "One, two" + "x" * (MAX_PROGRESS_CHARS + 5)
    (third,) = sends(ex.handle(ComputeProgress(TID, 0, long), 6), Progress)
    assert len(third.text) == MAX_PROGRESS_CHARS
    sent = [e for e in ex.handle(ComputeProgress(TID, 0, long), 7)]
    assert sends(sent, Progress)[0].text == "x" * 5
    assert all(e.peer == REQ.peer_id for e in sent)


def test_the_executor_streams_only_running_k1_jobs_whose_assignment_asks() -> None:
    assert sends(running(k=2).handle(ComputeProgress(TID, 0, "x"), 2), Progress) == []
    assert sends(running(stream=False).handle(ComputeProgress(TID, 0, "x"), 2), Progress) == []
    ex = running()
    assert sends(ex.handle(ComputeProgress(TID, 3, "x"), 2), Progress) == []  # another attempt
    done = ComputeDone(task_id=TID, attempt=0, answer="4", cot="x", confidence=1.0, tokens=1,
                       compute_ms=1, model_hash=MODEL.model_hash, fingerprints=(),
                       fingerprint_root=b"")
    ex.handle(done, 3)
    assert sends(ex.handle(ComputeProgress(TID, 0, "xy"), 4), Progress) == []


def test_the_executor_stops_at_the_frame_count() -> None:
    ex = running()
    for n in range(MAX_PROGRESS_FRAMES):
        assert sends(ex.handle(ComputeProgress(TID, 0, "a" * (n + 1)), 2), Progress)
    assert sends(ex.handle(ComputeProgress(TID, 0, "a" * 600), 3), Progress) == []


@pytest.mark.parametrize("stream", [True, False])
def test_an_assignment_asks_for_the_text_when_the_asker_follows_it(stream: bool) -> None:
    a, _ = auction()
    tid, _ = submit(a, k=1, stream=stream)
    effects = [e for n, who in enumerate(BIDDERS[:2]) for e in a.handle(bid(tid, who), n + 1)]
    (body,) = assigns(effects + a.handle(Tick(), 200))
    assert body.stream is stream
