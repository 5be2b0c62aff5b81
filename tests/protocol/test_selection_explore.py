"""The exploring selector: new peers get a bounded share of picks, and only that share."""

from __future__ import annotations

import pytest

from protocol.market.linucb import LinUCBSelector
from protocol.market.selection import Candidate, ExploringSelector, ScoreSelector


def cand(peer: str, rep: float) -> Candidate:
    return Candidate(peer=peer, match_score=1.0, reputation=rep, price=0.0, max_price=10.0,
                     est_latency_ms=100, deadline_ms=10_000, load=0.0, free_slots=1)


def test_plain_score_selector_never_picks_a_newcomer() -> None:
    honest = [cand("h1", 0.9), cand("h2", 0.8)]
    picks = [ScoreSelector().select(b"t", [*honest, cand("new", 0.5)], 1)[0].peer
             for _ in range(50)]
    assert "new" not in picks


def test_newcomer_gets_a_bounded_share() -> None:
    sel = ExploringSelector(ScoreSelector(), share=0.1)
    honest = [cand("h1", 0.9), cand("h2", 0.8)]
    for i in range(20):  # the honest peers build a record first
        sel.select(bytes([i]), honest, 1)
    newcomers = [f"n{i}" for i in range(30)]
    picks = []
    for i in range(100):
        cands = [*honest, *(cand(p, 0.5) for p in newcomers)]
        picks.append(sel.select(i.to_bytes(2, "big"), cands, 1)[0].peer)
    explored = [p for p in picks if p.startswith("n")]
    # new peers are picked, each at most once, and at most share of all 120 picks so far
    assert explored and len(explored) == len(set(explored))
    assert sel.explored <= 0.1 * sel.picks
    assert len(explored) >= 0.1 * 120 - 3
    assert picks.count("h1") >= 80


def test_first_newcomer_waits_about_one_over_share_picks() -> None:
    sel = ExploringSelector(ScoreSelector(), share=0.25)
    honest = [cand("h", 0.9)]
    for i in range(8):
        sel.select(bytes([i]), honest, 1)
    picks = [sel.select(bytes([100 + i]), [*honest, cand("new", 0.1)], 1)[0].peer
             for i in range(4)]
    assert "new" in picks
    assert picks.count("new") == 1  # picked once, then it is no longer new


def test_several_seats_replace_only_the_last() -> None:
    sel = ExploringSelector(ScoreSelector(), share=1.0)
    got = [c.peer for c in sel.select(b"t", [cand("a", 0.9), cand("b", 0.8), cand("c", 0.1)], 2)]
    assert got == ["a", "c"]
    assert [c.peer for c in sel.select(b"u", [cand("a", 0.9)], 2)] == ["a"]


def test_share_zero_is_the_inner_selector_and_observe_is_passed_on() -> None:
    sel = ExploringSelector(LinUCBSelector(), share=0.0)
    cands = [cand("a", 0.9), cand("b", 0.1)]
    inner = LinUCBSelector()
    for i in range(10):
        t = bytes([i])
        got, want = sel.select(t, cands, 1), inner.select(t, cands, 1)
        assert got == want
        sel.observe(t, got[0].peer, 1.0)
        inner.observe(t, want[0].peer, 1.0)
    assert sel.explored == 0


def test_memory_is_bounded_and_bad_settings_are_refused() -> None:
    sel = ExploringSelector(ScoreSelector(), share=1.0, max_tried=3)
    for i in range(10):
        sel.select(bytes([i]), [cand(f"p{i}", 0.5)], 1)
    assert len(sel.tried) == 3
    with pytest.raises(ValueError, match="share"):
        ExploringSelector(ScoreSelector(), share=1.5)
