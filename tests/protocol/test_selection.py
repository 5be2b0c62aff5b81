"""The score selector: the documented weighted formula, distinct picks, deterministic ties."""

from __future__ import annotations

import pytest

from protocol.market.selection import (
    Candidate,
    ScoreSelector,
    ScoreWeights,
)


def cand(peer: str, match: float = 1.0, rep: float = 0.5, price: float = 0.0,
         latency: int = 0, load: float = 0.0) -> Candidate:
    return Candidate(peer=peer, match_score=match, reputation=rep, price=price, max_price=10.0,
                     est_latency_ms=latency, deadline_ms=10_000, load=load, free_slots=1)


def test_weights_sum_to_one() -> None:
    w = ScoreWeights()
    assert w.match + w.reputation + w.price + w.latency == pytest.approx(1.0)


@pytest.mark.parametrize("c,expected", [
    (cand("a", 1.0, 1.0, 0.0, 0), 1.0),
    (cand("a", 0.0, 0.0, 10.0, 10_000), 0.0),
    (cand("a", 0.5, 0.5, 5.0, 5_000), 0.5),
    (cand("a", 1.0, 0.0, 10.0, 20_000), ScoreWeights().match),
    (cand("a", 0.0, 2.0, 10.0, 10_000), ScoreWeights().reputation),  # reputation is clamped to [0, 1]
])
def test_score_formula(c: Candidate, expected: float) -> None:
    assert ScoreSelector().score(c) == pytest.approx(expected)


def test_selects_best_first_distinct_and_at_most_n() -> None:
    cs = [cand("low", match=0.2), cand("high", match=1.0), cand("mid", match=0.6),
          cand("high", match=0.0)]
    picked = ScoreSelector().select(b"t", cs, 5)
    assert [c.peer for c in picked] == ["high", "mid", "low"]
    assert [c.peer for c in ScoreSelector().select(b"t", cs, 1)] == ["high"]
    assert ScoreSelector().select(b"t", cs, 0) == []


def test_ties_broken_by_peer_id_in_any_order() -> None:
    cs = [cand("c"), cand("a"), cand("b")]
    for order in (cs, cs[::-1], [cs[1], cs[2], cs[0]]):
        assert [c.peer for c in ScoreSelector().select(b"t", order, 2)] == ["a", "b"]


def test_reputation_weight_can_be_configured() -> None:
    cs = [cand("cheap", match=1.0, rep=0.0), cand("trusted", match=0.5, rep=1.0)]
    assert ScoreSelector().select(b"t", cs, 1)[0].peer == "trusted"
    only_match = ScoreSelector(ScoreWeights(match=1.0, reputation=0.0, price=0.0, latency=0.0))
    assert only_match.select(b"t", cs, 1)[0].peer == "cheap"


def test_independent_executors_are_preferred_to_a_second_of_one_group() -> None:
    cands = [cand("a1", rep=1.0), cand("a2", rep=1.0), cand("b", rep=0.7), cand("c", match=0.5, rep=0.0)]
    groups = {"a1": "A", "a2": "A", "b": "b", "c": "c"}
    assert [c.peer for c in ScoreSelector().select(b"t", cands, 2)] == ["a1", "a2"]
    picked = ScoreSelector(group_of=groups.__getitem__).select(b"t", cands, 2)
    assert [c.peer for c in picked] == ["a1", "b"]
    # the group's second member still comes before a far worse independent bidder
    picked = ScoreSelector(group_of=groups.__getitem__).select(b"t", cands, 3)
    assert [c.peer for c in picked] == ["a1", "b", "a2"]


def test_independence_penalty_is_per_pick_of_the_group() -> None:
    cands = [cand(f"g{i}", rep=1.0) for i in range(3)] + [cand("x", rep=0.0)]
    sel = ScoreSelector(ScoreWeights(independence=0.2),
                        group_of=lambda p: "G" if p.startswith("g") else p)
    # score gap g vs x is the reputation weight 0.3: one penalty (0.2) keeps g1 ahead, two (0.4) do not
    assert [c.peer for c in sel.select(b"t", cands, 4)] == ["g0", "g1", "x", "g2"]
