"""protocol/inference/placement.py: where a request runs (the market, a chain, nowhere, and
why), and the models ``GET /v1/models`` lists, over a real ledger view of signed records."""

from __future__ import annotations

import pytest

from crypto.envelope import Envelope
from protocol.codec import decode
from protocol.inference.placement import Route, chain_coverage, place, servable
from protocol.ledger.records import BlockOffer, CapabilityRecord
from protocol.ledger.state import LedgerState
from protocol.ledger.view import LedgerView
from tests.protocol.ledger_net import T0, identity, offer, record

BIG = "big-model"
WHOLE = "smollm2-135m"


def blocks(start: int, end: int, model: str = BIG, n: int = 30) -> BlockOffer:
    return BlockOffer(model=model, start=start, end=end, n_blocks=n, ms_per_block=1.0,
                      free_sessions=4, max_sessions=8, free_cache_bytes=1 << 30)


def view(*peers: tuple[int, tuple[str, ...], tuple[BlockOffer, ...]], at: int = T0,
         own: int = 99) -> LedgerView:
    """A ledger holding one record per (peer index, whole models, block offers)."""
    state = LedgerState()
    for i, models, offers in peers:
        env: Envelope = record(identity(i), 1, now=at + i, models=tuple(offer(m) for m in models),
                               blocks=offers)
        rec = decode(env.payload, CapabilityRecord)
        state.merge_record(env, rec, env.content_hash, T0)
        assert rec.peer_id in state.records
    return LedgerView(state, identity(own).peer_id, clock_offset_ms=T0)  # now 0 = T0


SPLIT = view((1, (), (blocks(0, 20),)), (2, (), (blocks(20, 30),)))


@pytest.mark.parametrize(("ledger", "model", "chains", "route", "reason"), [
    # served whole somewhere: the market, whatever blocks are offered
    (view((1, (WHOLE,), ()), (2, (), (blocks(0, 30, WHOLE),))), WHOLE, (WHOLE,), Route.MARKET,
     "served whole"),
    # no one holds it whole, its blocks are all covered, and this node holds its head: a chain
    (SPLIT, BIG, (BIG,), Route.CHAIN, "cover all 30"),
    # covered, but this node has no embedding and head of it
    (SPLIT, BIG, (), Route.NOT_FOUND, "holds no copy of its embedding"),
    # a hole in the coverage names the first block nobody serves
    (view((1, (), (blocks(0, 20),)), (2, (), (blocks(25, 30),))), BIG, (BIG,),
     Route.NOT_FOUND, "its block 20 (of 30)"),
    # offers that disagree on the model's block count do not cover it
    (view((1, (), (blocks(0, 20),)), (2, (), (blocks(20, 32, n=32),))), BIG, (BIG,),
     Route.NOT_FOUND, "its block 20"),
    (SPLIT, "gpt-9", (BIG,), Route.NOT_FOUND, "does not exist"),
    # "any model" goes to the market while something is served whole ...
    (view((1, (WHOLE,), ()), (2, (), (blocks(0, 30),))), "", (BIG,), Route.MARKET, "market"),
    # ... and to a chain only when nothing is
    (SPLIT, "", (BIG,), Route.CHAIN, "no model is served whole"),
    (SPLIT, "", (), Route.MARKET, "market"),
    # our own offer of blocks 20-30 is a hop of our chains: it completes the coverage ...
    (view((1, (), (blocks(0, 20),)), (99, (), (blocks(20, 30),))), BIG, (BIG,),
     Route.CHAIN, "cover all 30"),
    # ... and alone it leaves a hole like anyone's
    (view((99, (), (blocks(0, 15),))), BIG, (BIG,), Route.NOT_FOUND, "its block 15"),
])
def test_place_chooses_market_chain_or_not_found(ledger: LedgerView, model: str,
                                                 chains: tuple[str, ...], route: Route,
                                                 reason: str) -> None:
    got = place(ledger, 0, model, chain_models=chains)
    assert got.route is route and reason in got.reason
    if route is Route.CHAIN:
        assert got.model == BIG


def test_a_family_is_the_markets_and_own_models_count_as_whole() -> None:
    assert place(SPLIT, 0, "", family="smollm2", chain_models=(BIG,)).route is Route.MARKET
    assert place(SPLIT, 0, BIG, own_models=(BIG,), chain_models=(BIG,)).route is Route.MARKET


def test_expired_offers_do_not_cover() -> None:
    later = 20 * 60_000  # past the records' 15-minute lifetime
    assert place(SPLIT, later, BIG, chain_models=(BIG,)).route is Route.NOT_FOUND
    assert chain_coverage(SPLIT, 0) == {BIG: (30, 30)}
    assert chain_coverage(SPLIT, later) == {}


def test_servable_lists_chain_models_with_their_oldest_offer() -> None:
    ledger = view((1, (WHOLE,), ()), (2, (), (blocks(0, 20),)), (3, (), (blocks(15, 30),)),
                  (4, (), (blocks(0, 10, "holey"),)))
    got = servable(ledger, 0, own_models={"mine": 5}, chain_models=(BIG, "holey"))
    assert got == {"mine": 5, WHOLE: T0 + 1, BIG: T0 + 2}
    # without a head for it, a chain model is not listed
    assert BIG not in servable(ledger, 0, chain_models=())


def test_servable_lists_a_model_our_own_blocks_complete() -> None:
    ledger = view((1, (), (blocks(0, 15),)), (99, (), (blocks(15, 30),)))
    assert BIG in servable(ledger, 0, chain_models=(BIG,))
    assert BIG not in servable(view((99, (), (blocks(15, 30),))), 0, chain_models=(BIG,))
