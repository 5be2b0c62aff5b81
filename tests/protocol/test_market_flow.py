"""Full task-market flows: one Auction and several Executors through the wire codec,
with table-driven faults (forged, replayed, late, flooding, oversized, silent, killed)."""

from __future__ import annotations

import pytest

from protocol.codec import Message
from protocol.envelopes import open_envelope, seal
from protocol.market.auction import AuctionConfig, KeptResult, RestoredAttempt, RestoreTask
from protocol.market.linucb import LinUCBSelector
from protocol.market.messages import (
    BEACON_DOMAIN,
    BID_DOMAIN,
    MAX_COT_CHARS,
    RESULT_DOMAIN,
    Beacon,
    BeaconBody,
    Bid,
    BidBody,
    Result,
    ResultBody,
)
from tests.protocol.market_net import MODEL, MarketNet, ident

DEADLINE = 30_000


def bid_body(task_id: bytes, bidder: str, round_: int = 0) -> BidBody:
    return BidBody(task_id=task_id, round=round_, bidder=bidder, model=MODEL.name,
                   model_hash=MODEL.model_hash, match_score=1.0, price=0.0,
                   est_latency_ms=100, load=0.0, free_slots=1, hold_ms=5_000)


def result_body(task_id: bytes, executor: str, attempt: int = 0, cot: str = "cot",
                answer: str = "42") -> ResultBody:
    return ResultBody(task_id=task_id, attempt=attempt, executor=executor, answer=answer,
                      cot=cot, confidence=0.9, tokens=3, compute_ms=5,
                      model_hash=MODEL.model_hash, fingerprints=(), fingerprint_root=b"")


def done(net: MarketNet, task_id: bytes) -> dict[str, object]:
    net.step_to(net.now + DEADLINE + 1)
    return net.last(task_id)


def test_happy_path_three_votes() -> None:
    net = MarketNet(3)
    tid = net.submit()
    snap = done(net, tid)
    assert snap["phase"] == "done" and snap["answer"] == "42" and not snap["partial"]
    assert len(snap["results"]) == 3  # type: ignore[arg-type]
    assert snap["votes"][0]["count"] == 3  # type: ignore[index]
    assert sorted(a.subject for a in net.attests if a.outcome == "completed") == \
        sorted(net.peers())
    # three executors and one spare wanted: no spare came, so the window closed the grace
    # after the third bid instead of running out
    config = AuctionConfig()
    assert config.close_grace_ms <= snap["first_assigned_at_ms"] < config.bid_window_ms  # type: ignore[operator]
    assert snap["finished_at_ms"] < DEADLINE  # type: ignore[operator]


def test_auction_closes_early_with_enough_bids() -> None:
    net = MarketNet(5)
    tid = net.submit()
    net.step_to(20)
    # a bid that came after the close is refused and its slot released at once
    assert net.auction.counters["bids_rejected.late"] == 1
    assert sum(w.machine.free_slots() for w in net.workers.values()) == 1
    snap = done(net, tid)
    assert snap["phase"] == "done"
    assert snap["first_assigned_at_ms"] < 50  # type: ignore[operator]
    # the fourth bidder was kept as a spare and released at the end
    assert sum(1 for a in snap["attempts"] if a["state"] == "answered") == 3  # type: ignore


def test_disagreeing_executor_is_outvoted_and_attested() -> None:
    net = MarketNet(3)
    loser = net.peers()[2]
    net.workers[loser].answer = "41"
    tid = net.submit()
    snap = done(net, tid)
    assert snap["answer"] == "42"
    assert [(a.subject, a.outcome) for a in net.attests if a.outcome == "wrong"] == \
        [(loser, "wrong")]


def test_silent_executor_replaced_from_spare_bid() -> None:
    net = MarketNet(4)
    silent = net.peers()[0]
    net.workers[silent].behaviour = "silent"
    tid = net.submit()
    snap = done(net, tid)
    assert snap["phase"] == "done" and not snap["partial"]
    answered = {a["peer"] for a in snap["attempts"] if a["state"] == "answered"}  # type: ignore
    assert silent not in answered and len(answered) == 3
    assert any(a.subject == silent and a.outcome == "timeout" for a in net.attests)
    assert snap["finished_at_ms"] < DEADLINE  # type: ignore[operator]


def test_silent_executor_replaced_by_a_new_beacon() -> None:
    net = MarketNet(4)
    silent, late = net.peers()[0], net.peers()[3]
    net.workers[silent].behaviour = "silent"

    def hide_first_round(src: str, dest: str, msg: Message) -> Message | None:
        if dest == late and isinstance(msg, Beacon):
            body = open_envelope(msg.envelope, BEACON_DOMAIN, BeaconBody, 1 << 20)
            return None if body.round == 0 else msg
        return msg

    net.tap = hide_first_round
    tid = net.submit()
    snap = done(net, tid)
    assert snap["phase"] == "done" and not snap["partial"] and snap["round"] == 1
    assert late in {r["executor"] for r in snap["results"]}  # type: ignore[union-attr]
    assert net.auction.counters["replans"] == 1


def test_killed_executor_is_replaced_at_once() -> None:
    net = MarketNet(4)
    victim = net.peers()[0]
    net.workers[victim].compute_ms = 10_000
    tid = net.submit()
    net.step_to(100)  # assigned, computing
    assert any(a.peer == victim for a in net.auction.tasks[tid].active)
    net.kill(victim)
    snap = done(net, tid)
    assert snap["phase"] == "done" and not snap["partial"]
    assert snap["finished_at_ms"] < 1_000  # type: ignore[operator]
    assert victim not in {r["executor"] for r in snap["results"]}  # type: ignore[union-attr]


def test_partial_results_kept_at_deadline() -> None:
    net = MarketNet(3, config=AuctionConfig(max_rounds=1))
    net.workers[net.peers()[0]].behaviour = "silent"
    tid = net.submit(deadline_ms=10_000)
    snap = done(net, tid)
    assert snap["phase"] == "done" and snap["partial"] and snap["answer"] == "42"
    assert len(snap["results"]) == 2  # type: ignore[arg-type]


def test_all_silent_fails_cleanly() -> None:
    net = MarketNet(2, config=AuctionConfig(max_rounds=2))
    for w in net.workers.values():
        w.behaviour = "silent"
    tid = net.submit(k=2, deadline_ms=8_000)
    snap = done(net, tid)
    assert snap["phase"] == "failed" and snap["answer"] is None
    assert snap["failure"]


def test_no_bidders_fails_after_rounds() -> None:
    net = MarketNet(0, config=AuctionConfig(max_rounds=2))
    tid = net.submit(k=1)
    snap = done(net, tid)
    # bidless rounds back off and do not count toward max_rounds: more than two are held,
    # and the task fails, saying so, before its deadline
    assert snap["phase"] == "failed" and snap["round"] >= 2  # type: ignore[operator]
    assert str(snap["failure"]).startswith("no executor left: none bid in")
    assert snap["finished_at_ms"] < DEADLINE  # type: ignore[operator]


def test_unparseable_answer_abstains_and_is_attested_wrong_not_failed() -> None:
    net = MarketNet(4)
    bad = net.peers()[0]
    net.workers[bad].answer = "no idea"
    tid = net.submit()
    snap = done(net, tid)
    assert snap["phase"] == "done" and not snap["partial"]
    assert bad in {r["executor"] for r in snap["results"]}  # type: ignore[union-attr]
    outcomes = {a.outcome for a in net.attests if a.subject == bad}
    assert outcomes == {"wrong"}


@pytest.mark.parametrize("behaviour", ["model_mismatch", "compute_failed"])
def test_malformed_answer_replaced(behaviour: str) -> None:
    net = MarketNet(4)
    bad = net.peers()[0]
    tid = net.submit()
    if behaviour in ("model_mismatch", "compute_failed"):
        from protocol.market.executor import ComputeDone, ComputeFailed

        net.workers[bad].behaviour = "silent"
        net.step_to(20)
        start = net.workers[bad].started[0]
        if behaviour == "model_mismatch":
            ev: object = ComputeDone(task_id=tid, attempt=start.attempt, answer="42", cot="c",
                                     confidence=0.9, tokens=3, compute_ms=5,
                                     model_hash=b"\x22" * 32)
        else:
            ev = ComputeFailed(tid, start.attempt, "out of memory")
        net.schedule(net.now, bad, ev)
    snap = done(net, tid)
    assert snap["phase"] == "done" and not snap["partial"]
    assert bad not in {r["executor"] for r in snap["results"]}  # type: ignore[union-attr]
    assert any(a.subject == bad and a.outcome == "failed" for a in net.attests)


# ---------------------------------------------------------------- forged / replayed / late


def _first_bid(net: MarketNet) -> tuple[str, Bid]:
    return next((s, m) for s, d, m in net.sent if isinstance(m, Bid))


def _first_result(net: MarketNet) -> tuple[str, Result]:
    return next((s, m) for s, d, m in net.sent if isinstance(m, Result))


def fault_forged_bid(net: MarketNet, tid: bytes) -> None:
    other = ident(99)
    net.inject(net.peers()[0], net.rq, Bid(envelope=seal(other, BID_DOMAIN,
                                                        bid_body(tid, other.peer_id))))


def fault_replayed_bid(net: MarketNet, tid: bytes) -> None:
    src, bid = _first_bid(net)
    net.inject(src, net.rq, bid)


def fault_late_bid(net: MarketNet, tid: bytes) -> None:
    w = ident(98)
    net.inject(w.peer_id, net.rq, Bid(envelope=seal(w, BID_DOMAIN, bid_body(tid, w.peer_id))),
               at=net.now + 2_000)


def fault_unknown_task_bid(net: MarketNet, tid: bytes) -> None:
    w = ident(97)
    net.inject(w.peer_id, net.rq,
               Bid(envelope=seal(w, BID_DOMAIN, bid_body(b"\x01" * 32, w.peer_id))))


def fault_bid_flood(net: MarketNet, tid: bytes) -> None:
    w = ident(96)
    for i in range(100):
        body = bid_body(b"\x02" * 32, w.peer_id, round_=i % 60)
        net.inject(w.peer_id, net.rq, Bid(envelope=seal(w, BID_DOMAIN, body)))


def fault_forged_result(net: MarketNet, tid: bytes) -> None:
    victim = net.peers()[0]
    other = ident(95)
    net.inject(victim, net.rq, Result(envelope=seal(other, RESULT_DOMAIN,
                                                    result_body(tid, other.peer_id))))


def fault_unassigned_result(net: MarketNet, tid: bytes) -> None:
    other = ident(94)
    net.inject(other.peer_id, net.rq, Result(envelope=seal(other, RESULT_DOMAIN,
                                                           result_body(tid, other.peer_id))))


def fault_replayed_result(net: MarketNet, tid: bytes) -> None:
    net.step_to(net.now + 200)  # results in
    src, res = _first_result(net)
    net.inject(src, net.rq, res)


def fault_unknown_task_result(net: MarketNet, tid: bytes) -> None:
    w = ident(93)
    net.inject(w.peer_id, net.rq, Result(envelope=seal(w, RESULT_DOMAIN,
                                                       result_body(b"\x03" * 32, w.peer_id))))


def fault_oversized_cot(net: MarketNet, tid: bytes) -> None:
    att = net.auction.tasks[tid].active[0]  # four bids closed the auction at once
    w = net.workers[att.peer]
    w.behaviour = "silent"
    body = result_body(tid, att.peer, att.attempt, cot="x" * (MAX_COT_CHARS + 1))
    net.inject(att.peer, net.rq, Result(envelope=seal(w.machine.identity, RESULT_DOMAIN, body)))


FAULTS = [
    (fault_forged_bid, "bids_rejected.forged", True),
    (fault_replayed_bid, "bids_rejected.duplicate", False),
    (fault_late_bid, "bids_rejected.late", False),
    (fault_unknown_task_bid, "bids_rejected.unknown_task", False),
    (fault_bid_flood, "bids_rejected.rate_limited", True),
    (fault_forged_result, "results_rejected.forged", True),
    (fault_unassigned_result, "results_rejected.not_assigned", True),
    (fault_replayed_result, "results_rejected.duplicate", False),
    (fault_unknown_task_result, "results_rejected.unknown_task", False),
    (fault_oversized_cot, "results_rejected.invalid", True),
]


@pytest.mark.parametrize("fault,counter,penalized", FAULTS, ids=[f[0].__name__ for f in FAULTS])
def test_faults_are_rejected_counted_and_the_task_completes(fault, counter, penalized) -> None:  # type: ignore[no-untyped-def]
    net = MarketNet(4)
    tid = net.submit()
    net.step_to(5)  # beacons delivered, bids on their way
    fault(net, tid)
    snap = done(net, tid)
    assert net.auction.counters.get(counter, 0) >= 1, net.auction.counters
    assert bool(net.penalties) == penalized
    assert snap["phase"] == "done" and snap["answer"] == "42" and not snap["partial"]


def test_bid_flood_is_capped_by_the_rate() -> None:
    net = MarketNet(0, config=AuctionConfig(bid_rate=10))
    net.submit(k=1)
    fault_bid_flood(net, b"")
    net.step_to(10)
    assert net.auction.counters["bids_rejected.rate_limited"] == 90
    assert net.auction.counters["bids_rejected.unknown_task"] == 10


def test_cot_over_the_requesters_limit_is_rejected() -> None:
    net = MarketNet(4, config=AuctionConfig(max_cot_chars=4))
    tid = net.submit()
    snap = done(net, tid)  # every worker's CoT is "think 42": too long
    assert net.auction.counters["results_rejected.oversized"] >= 3
    assert snap["phase"] == "failed"


def test_requester_never_assigns_itself_unless_asked() -> None:
    net = MarketNet(1)
    tid = net.submit(k=1)
    me = net.requester
    net.inject(me.peer_id, net.rq, Bid(envelope=seal(me, BID_DOMAIN, bid_body(tid, me.peer_id))))
    snap = done(net, tid)
    assert net.auction.counters["bids_rejected.self"] == 1
    assert me.peer_id not in {a["peer"] for a in snap["attempts"]}  # type: ignore[union-attr]


def test_linucb_selector_flow_learns_from_votes() -> None:
    selector = LinUCBSelector()
    net = MarketNet(4, selector=selector)
    bad = net.peers()[1]
    net.workers[bad].answer = "7"
    for _ in range(6):
        tid = net.submit()
        assert done(net, tid)["answer"] == "42"
    assert not selector.model.pending  # every chosen arm got its reward
    assert selector.model.arms[bad].pulls >= 1
    theta_bad = selector.model.theta(bad)
    good = next(p for p in net.peers() if p != bad and p in selector.model.arms)
    assert sum(theta_bad) < sum(selector.model.theta(good))


def test_restore_resumes_with_kept_results() -> None:
    net = MarketNet(3)
    first = net.peers()[0]
    tid = net.submit()
    net.step_to(net.now + 1_510 + 120)  # results in flight or in
    spec = net.auction.tasks[tid].spec
    kept = net.auction.tasks[tid].results[first]
    # a new requester process: same identity, empty memory
    fresh = MarketNet(3)
    fresh.workers = net.workers
    fresh.now = net.now
    effects = fresh.auction.handle(RestoreTask(
        spec=spec, allow_self=False, remaining_ms=20_000, round=0, next_attempt=3,
        tried=(first,), kept=(KeptResult(kept.envelope.encode(), 1.0),)), fresh.now)
    fresh.perform(fresh.rq, effects)
    assert fresh.auction.tasks[tid].round == 1
    snap = done(fresh, tid)
    assert snap["phase"] in ("done", "failed")
    assert first in {r["executor"] for r in snap["results"]}  # type: ignore[union-attr]


def test_restore_without_time_fails_or_votes_cleanly() -> None:
    net = MarketNet(0)
    spec_net = MarketNet(0)
    tid = spec_net.submit()
    spec = spec_net.auction.tasks[tid].spec
    effects = net.auction.handle(RestoreTask(spec=spec, allow_self=False, remaining_ms=0,
                                             round=0, next_attempt=0), 0)
    net.perform(net.rq, effects)
    assert net.last(tid)["phase"] == "failed"



def test_restore_keeps_attempts_that_were_running() -> None:
    # the window runs to its end: no early close while the wanted count is short of spares
    net = MarketNet(3, config=AuctionConfig(close_grace_ms=1_500))
    tid = net.submit()
    net.step_to(1_550)  # the window closed at 1500: three executors computing
    running = net.auction.tasks[tid].active
    assert len(running) == 3
    fresh = MarketNet(0)  # the requester restarted: same key, empty memory
    fresh.now = net.now
    assigned = tuple(RestoredAttempt(a.peer, a.attempt, 5_000, 1.0, MODEL.name)
                     for a in running)
    fresh.perform(fresh.rq, fresh.auction.handle(RestoreTask(
        spec=net.auction.tasks[tid].spec, allow_self=False, remaining_ms=20_000, round=0,
        next_attempt=3, tried=tuple(a.peer for a in running), assigned=assigned), fresh.now))
    assert not any(isinstance(m, Beacon) for _, _, m in fresh.sent)  # nothing to replan
    for a in running:
        who = net.workers[a.peer].machine.identity
        fresh.inject(a.peer, fresh.rq, Result(envelope=seal(who, RESULT_DOMAIN,
                                                            result_body(tid, a.peer, a.attempt))))
    snap = done(fresh, tid)
    assert snap["phase"] == "done" and len(snap["results"]) == 3  # type: ignore[arg-type]
    assert "results_rejected.not_assigned" not in fresh.auction.counters
