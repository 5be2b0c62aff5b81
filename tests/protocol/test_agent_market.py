"""Agents in the task market: the requester matches each bid from the bidder's card in its own
ledger (never from the bid's claim), bidders bid with their best-fitting agent, a task may name
an agent, and the agent fields on the wire are bounded."""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.agents.cards import AgentCard, AgentCards
from protocol.agents.matching import LEGACY_MATCH, quantize
from protocol.agents.wire import (
    MAX_SYSTEM_PROMPT_CHARS,
    MAX_TOOL_ARGUMENTS_CHARS,
    MAX_TOOL_CALLS,
    MAX_TOOL_OUTPUT_CHARS,
    ToolCallRecord,
    agent_matcher,
    canonical_arguments,
    card_match,
    restated_answer,
    tool_transcript,
)
from protocol.codec import decode, encode
from protocol.envelopes import seal
from protocol.errors import InvalidMessage
from protocol.machine import Received, Send, Tick
from protocol.market.auction import Auction, AuctionConfig, AuctionOptions, SubmitTask
from protocol.market.messages import (
    BID_DOMAIN,
    RESULT_DOMAIN,
    Bid,
    BidBody,
    Cancel,
    Requirement,
    Result,
    ResultBody,
)
from protocol.market.offers import best_offer
from protocol.market.selection import ScoreSelector
from tests.protocol.agent_fixtures import EMBEDDER, card, cards_ledger, cards_record
from tests.protocol.executor_net import beacon, executor, sends
from tests.protocol.market_net import MODEL, MarketNet, ident

ME = ident(1)
CALC_VEC = (0.6, -0.8, 0.0)
TEXT_VEC = (0.0, 0.0, 1.0)


def translator(name: str = "translate") -> AgentCard:
    return card(name, vector=TEXT_VEC, skills=("translation",), tools=(),
                description="Translates between languages.")


def need(**kw: object) -> dict[str, object]:
    """SubmitTask fields of a need whose text the requester embedded as ``vector``."""
    vector = kw.pop("vector", None)
    fields: dict[str, object] = dict(kw)
    if vector is not None:
        data, scale = quantize(vector)  # type: ignore[arg-type]
        fields.update(need_embedding=data, need_scale=scale, embedder_hash=EMBEDDER)
    return fields


def auction(cards: dict[str, AgentCards]) -> Auction:
    return Auction(ME, ScoreSelector(), random.Random(1), AuctionConfig(bid_window_ms=1_000),
                   AuctionOptions(agent_match=agent_matcher(cards.get)))


def submit(a: Auction, **kw: object) -> bytes:
    fields: dict[str, object] = {"question": "What is 1234 * 5678?", "answer_type": "number",
                                 "deadline_ms": 20_000, "k": 1, "max_price": 5.0}
    fields.update(kw)
    a.handle(SubmitTask(**fields), 0)  # type: ignore[arg-type]
    return list(a.tasks)[-1]


def bid(task_id: bytes, who_n: int, agent: str, claim: float) -> Received:
    who = ident(who_n)
    body = BidBody(task_id=task_id, round=0, bidder=who.peer_id, model=MODEL.name,
                   model_hash=MODEL.model_hash, match_score=claim, price=1.0,
                   est_latency_ms=1_000, load=0.0, free_slots=1, hold_ms=5_000, agent=agent)
    return Received(who.peer_id, Bid(envelope=seal(who, BID_DOMAIN, body)))


# ---------------------------------------------------------------- requester side


def test_the_requesters_match_from_the_card_overrides_the_bidders_claim() -> None:
    liar, honest = ident(20).peer_id, ident(21).peer_id
    a = auction(cards_ledger({liar: (translator(),), honest: (card("calc", vector=CALC_VEC),)}))
    tid = submit(a, **need(needs="exact arithmetic", skills=("arithmetic",), vector=CALC_VEC))
    a.handle(bid(tid, 20, "translate", claim=1.0), 10)
    assert a.tasks[tid].bids[liar].match == 0.0  # the card's, not the claimed 1.0
    effects = a.handle(bid(tid, 21, "calc", claim=0.0), 11)  # k + 1 bids: the window closes
    (assigned,) = [e for e in effects if isinstance(e, Send) and not isinstance(e.message, Cancel)]
    assert assigned.peer == honest
    attempt = next(iter(a.tasks[tid].attempts.values()))
    assert attempt.bid.match == pytest.approx(1.0, abs=0.01)
    assert a.tasks[tid].spares[liar].match == 0.0


def _assigned(effects: list[object]) -> list[str]:
    return [e.peer for e in effects if isinstance(e, Send) and not isinstance(e.message, Cancel)]


def test_a_late_specialist_still_wins_a_step_the_first_arrivals_would_have_closed() -> None:
    """A need's window does not close at ``wanted + spare_bids`` bids while a better match may
    still come: the calculator agent bidding third wins over two generalists (the old rule
    closed at the second bid and handed the step to the nearest generalist)."""
    gens, calc = (ident(20).peer_id, ident(21).peer_id), ident(22).peer_id
    a = auction(cards_ledger({gens[0]: (translator(),), gens[1]: (translator(),),
                        calc: (card("calc", vector=CALC_VEC, skills=("math",)),)}))
    tid = submit(a, **need(needs="exact arithmetic", skills=("arithmetic",), vector=CALC_VEC))
    assert _assigned(a.handle(bid(tid, 20, "translate", claim=1.0), 10)) == []
    assert _assigned(a.handle(bid(tid, 21, "translate", claim=1.0), 20)) == []  # k + spare in
    assert _assigned(a.handle(bid(tid, 22, "calc", claim=0.0), 400)) == []  # past the grace
    assert 0.0 < a.tasks[tid].bids[calc].match < 1.0  # text matches, tags do not: beatable
    assert _assigned(a.handle(Tick(), a.next_deadline() or 0)) == [calc]  # at the deadline


def test_a_need_window_closes_once_every_possible_bidder_has_bid_or_the_best_match_is_in() -> None:
    gen, calc = ident(20).peer_id, ident(21).peer_id
    cards = cards_ledger({gen: (translator(),), calc: (card("calc", vector=CALC_VEC),)})
    a = Auction(ME, ScoreSelector(), random.Random(1), AuctionConfig(bid_window_ms=1_000),
                AuctionOptions(agent_match=agent_matcher(cards.get),
                               possible_bidders=lambda task: 2))
    tid = submit(a, **need(needs="exact arithmetic", skills=("arithmetic",), vector=CALC_VEC))
    assert _assigned(a.handle(bid(tid, 20, "translate", claim=1.0), 10)) == []
    assert _assigned(a.handle(bid(tid, 21, "calc", claim=0.0), 20)) == [calc]  # all are in
    # tags only: the calculator's full overlap is the best match there is, so no wait
    b = auction(cards)
    tid = submit(b, **need(skills=("arithmetic",)))
    assert _assigned(b.handle(bid(tid, 21, "calc", claim=0.0), 10)) == []  # k, no spare yet
    assert b.next_deadline() == 10 + AuctionConfig().close_grace_ms
    assert _assigned(b.handle(bid(tid, 20, "translate", claim=1.0), 20)) == [calc]


def test_a_bid_naming_an_agent_without_a_card_is_refused_and_counted() -> None:
    peer = ident(20).peer_id
    a = auction(cards_ledger({peer: (card("calc"),)}))
    tid = submit(a, **need(skills=("arithmetic",)))
    effects = a.handle(bid(tid, 20, "ghost", claim=1.0), 10)
    assert a.counters["bids_rejected.no_card"] == 1
    assert any(isinstance(e, Send) and isinstance(e.message, Cancel) for e in effects)
    effects = a.handle(bid(tid, 21, "calc", claim=1.0), 11)  # a node with no cards at all
    assert a.counters["bids_rejected.no_card"] == 2 and not a.tasks[tid].bids


def test_a_task_naming_an_agent_accepts_only_that_agents_bids() -> None:
    p20, p21 = ident(20).peer_id, ident(21).peer_id
    a = auction(cards_ledger({p20: (card("calc"), translator()), p21: (card("calc"),)}))
    tid = submit(a, k=2, **need(agent="calc"))
    a.handle(bid(tid, 20, "translate", claim=1.0), 10)
    assert a.counters["bids_rejected.other_agent"] == 1
    a.handle(bid(tid, 21, "calc", claim=0.0), 11)
    # a named agent with no text nor tags: every card of that name matches as any agent
    assert a.tasks[tid].bids[p21].match == LEGACY_MATCH


def test_a_task_without_a_need_keeps_the_model_rule() -> None:
    a = auction({})  # no cards at all: tasks that name no need do not look at them
    tid = submit(a)
    a.handle(bid(tid, 20, "", claim=0.75), 10)
    assert a.tasks[tid].bids[ident(20).peer_id].match == 0.75


def test_a_result_from_another_agent_than_the_bids_is_refused() -> None:
    net = MarketNet(1, agent_match=agent_matcher(lambda peer: cards_record(
        ident(2), cards=(card("calc", vector=CALC_VEC),), peer_id=peer)),
        agents=((card("calc", vector=CALC_VEC),),))
    worker = net.peers()[0]
    body_of: dict[str, ResultBody] = {}

    def swap_agent(src: str, dest: str, msg: object) -> object:
        if isinstance(msg, Result):
            from protocol.envelopes import open_envelope

            body = open_envelope(msg.envelope, RESULT_DOMAIN, ResultBody, 1 << 20)
            body_of["sent"] = body
            forged = ResultBody(**{**{f: getattr(body, f) for f in body.__slots__},
                                   "agent": "other"})  # type: ignore[arg-type]
            return Result(envelope=seal(ident(10), RESULT_DOMAIN, forged))
        return msg

    net.tap = swap_agent  # type: ignore[assignment]
    tid = net.submit(k=1, deadline_ms=20_000, **need(skills=("math",)))
    net.step_to(25_000)
    assert body_of["sent"].agent == "calc"
    assert net.auction.counters["results_rejected.agent_mismatch"] == 1
    assert worker in net.last(tid)["tried"]


def test_the_market_routes_a_need_to_the_specialist_and_the_result_names_it() -> None:
    calc, gen = card("calc", vector=CALC_VEC), translator("generalist")
    cards = {ident(10).peer_id: (gen,), ident(11).peer_id: (calc,), ident(12).peer_id: (gen,)}
    net = MarketNet(3, agent_match=agent_matcher(cards_ledger(cards).get),
                    agents=((gen,), (calc,), (gen,)))
    tid = net.submit(k=1, **need(needs="exact arithmetic", vector=CALC_VEC))
    net.step_to(40_000)
    snap = net.last(tid)
    assert snap["phase"] == "done" and snap["needs"] == "exact arithmetic"
    (row,) = snap["results"]  # type: ignore[misc]
    assert row["executor"] == ident(11).peer_id and row["agent"] == "calc"
    (attempt,) = snap["attempts"]  # type: ignore[misc]
    assert attempt["agent"] == "calc"
    # without a need every agent is alike: the market decides by today's rule
    tid2 = net.submit(k=3)
    net.step_to(80_000)
    assert {r["agent"] for r in net.last(tid2)["results"]} == {"calc", "generalist"}  # type: ignore[union-attr]


# ---------------------------------------------------------------- bidder side


def test_the_bidder_offers_its_best_fitting_agent() -> None:
    calc, words = card("calc", vector=CALC_VEC), translator()
    req = Requirement(model="", family="", min_context=0, needs="sums",
                      skills=("arithmetic",))
    offer = best_offer(req, (MODEL,), (words, calc))
    assert offer is not None and offer.agent == "calc" and offer.score == 1.0
    legacy = best_offer(Requirement(model="", family="", min_context=0), (MODEL,), (words, calc))
    assert legacy is not None and legacy.agent == "translate" and legacy.score == 0.5
    named = Requirement(model="", family="", min_context=0, agent="translate")
    assert best_offer(named, (MODEL,), (calc,)) is None
    assert best_offer(req, (MODEL,), ()) is None  # a bare model never bids on a need
    unserved = card("calc", vector=CALC_VEC, model="other-model")
    assert best_offer(req, (MODEL,), (unserved,)) is None


def test_card_match_is_the_matching_rule_over_the_cards_vector_and_tags() -> None:
    data, scale = quantize(CALC_VEC)
    req = Requirement(model="", family="", min_context=0, needs="x", skills=("math",),
                      need_embedding=data, need_scale=scale, embedder_hash=EMBEDDER)
    assert card_match(card("calc", vector=CALC_VEC), req) == pytest.approx(1.0, abs=0.01)
    other_embedder = card("calc", vector=CALC_VEC, embedder_hash=bytes(32))
    assert card_match(other_embedder, req) == pytest.approx(0.5)  # tags only count
    assert card_match(None, req) is None


# ---------------------------------------------------------------- the wire


def test_an_old_style_requirement_frame_decodes_with_no_need() -> None:
    old = msgpack.packb([40, 1, "smollm2", "", 0], use_bin_type=True)
    req = decode(old, Requirement)
    assert req == Requirement(model="smollm2", family="", min_context=0)
    # re-encoded it carries every field, the need's defaults included (11 items)
    assert encode(req) == b"\x9b" + old[1:] + bytes.fromhex("a0 90 a0 c4 00 cb 0000000000000000 c400"
                                                             .replace(" ", ""))


def test_golden_bytes_of_a_tool_call() -> None:
    record = ToolCallRecord(name="calculator", arguments=canonical_arguments(
        {"expression": "1234 * 5678"}), output="7006652")
    assert encode(record).hex() == (
        "95cc b701 aa63616c63756c61746f72 bc 7b2265787072657373696f6e223a2231323334202a20"
        "35363738227d a7 37303036363532".replace(" ", ""))
    assert decode(encode(record), ToolCallRecord) == record


@pytest.mark.parametrize("make, why", [
    (lambda: ToolCallRecord(name="c", arguments="{}", output="x" * (MAX_TOOL_OUTPUT_CHARS + 1)),
     "output"),
    (lambda: ToolCallRecord(name="c", arguments="{" + " " * MAX_TOOL_ARGUMENTS_CHARS + "}",
                            output=""), "arguments"),
    (lambda: ToolCallRecord(name="c", arguments="[1]", output=""), "object"),
    (lambda: ToolCallRecord(name="bad name", arguments="{}", output=""), "tool name"),
])
def test_oversized_or_malformed_tool_calls_are_refused(make, why) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidMessage, match=why):
        decode(encode(make()), ToolCallRecord)


def _result(**kw: object) -> ResultBody:
    fields: dict[str, object] = dict(
        task_id=b"\x01" * 32, attempt=0, executor="p", answer="7006652", cot="c",
        confidence=1.0, tokens=1, compute_ms=1, model_hash=b"", fingerprints=(),
        fingerprint_root=b"", agent="calc")
    fields.update(kw)
    return ResultBody(**fields)  # type: ignore[arg-type]


def test_a_result_with_too_many_tool_calls_is_refused() -> None:
    call = ToolCallRecord(name="calculator", arguments="{}", output="1")
    ok = _result(tool_calls=(call,) * MAX_TOOL_CALLS)
    assert decode(encode(ok), ResultBody) == ok
    with pytest.raises(InvalidMessage, match="tool_calls"):
        decode(encode(_result(tool_calls=(call,) * (MAX_TOOL_CALLS + 1))), ResultBody)
    with pytest.raises(InvalidMessage, match="system_prompt"):
        decode(encode(_result(system_prompt="s" * (MAX_SYSTEM_PROMPT_CHARS + 1))), ResultBody)


@pytest.mark.parametrize("kw, why", [
    ({"skills": ("Not Normal",)}, "normalized"),
    ({"skills": ("math", "math")}, "repeat"),
    ({"agent": "no spaces"}, "agent name"),
    ({"needs": "x", "need_embedding": b"\x01", "need_scale": 0.1}, "embedder hash"),
    ({"need_embedding": b"\x01", "need_scale": 0.1, "embedder_hash": EMBEDDER}, "need text"),
    ({"needs": "x", "embedder_hash": EMBEDDER}, "without a need vector"),
])
def test_bad_needs_are_refused(kw, why) -> None:  # type: ignore[no-untyped-def]
    req = Requirement(model="", family="", min_context=0, **kw)
    with pytest.raises(InvalidMessage, match=why):
        decode(encode(req), Requirement)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.text(max_size=40), st.text(max_size=40)), max_size=12),
       st.text(max_size=17_000))
def test_result_decoding_with_tool_calls_is_total(calls, prompt) -> None:  # type: ignore[no-untyped-def]
    records = tuple(ToolCallRecord(name="t", arguments=canonical_arguments({"a": a}), output=o)
                    for a, o in calls)
    frame = encode(_result(tool_calls=records, system_prompt=prompt))
    fits = len(records) <= MAX_TOOL_CALLS and len(prompt) <= MAX_SYSTEM_PROMPT_CHARS
    try:
        decoded = decode(frame, ResultBody)
    except InvalidMessage:
        assert not fits
    else:
        assert fits and decoded.tool_calls == records


# ---------------------------------------------------------------- the text the model reads


def test_the_transcript_and_the_restated_answer() -> None:
    call = ToolCallRecord(name="calculator", arguments='{"expression":"1234*5678"}',
                          output="7006652")
    assert tool_transcript((call,)) == (
        'Tool call 1: calculator {"expression":"1234*5678"}\nTool output 1: 7006652')
    assert restated_answer("It is 7006653", (call,)) == "7006652"
    assert restated_answer("7,006,652 is the product", (call,)) == "7006652"
    assert restated_answer("the answer is 7006652", (call,)) == "the answer is 7006652"
    failed = ToolCallRecord(name="calculator", arguments="{}", output="error: bad expression")
    assert restated_answer("12", (failed,)) == "12"
    assert restated_answer("12", ()) == "12"
    # an answer cut at its token budget gives way to the output even when it contains it
    assert restated_answer("7006652 is 1234 times", (call,), cut=True) == "7006652"
    assert restated_answer("7006652 is 1234 times", (call,)) == "7006652 is 1234 times"


def test_an_agents_tool_allowance_counts_in_its_bids_latency() -> None:
    calc = card("calc", vector=CALC_VEC, model=MODEL.name)
    plain = executor(agents=(calc,)).handle(beacon(model=""), 0)
    tooled = executor(agents=(calc,), tool_ms=(("calc", 42_000),)).handle(beacon(model=""), 0)
    (a,), (b,) = sends(plain, Bid), sends(tooled, Bid)
    base, more = a.envelope.payload, b.envelope.payload
    assert decode(base).est_latency_ms + 42_000 == decode(more).est_latency_ms
    # past the task's deadline with its tools at their limits, it does not bid at all
    late = executor(agents=(calc,), tool_ms=(("calc", 61_000),)).handle(beacon(model=""), 0)
    assert not sends(late, Bid)
