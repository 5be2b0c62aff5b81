"""Weighted voting: the documented weight, normalization, deterministic ties, the vote table."""

from __future__ import annotations

import itertools

import pytest

from protocol.answers import AnswerType
from protocol.market.voting import WEIGHT_FLOOR, Ballot, ballot_weight, vote


def b(executor: str, answer: str, conf: float = 1.0, rep: float = 1.0,
      match: float = 1.0) -> Ballot:
    return Ballot(executor=executor, answer=answer, confidence=conf, reputation=rep,
                  match_score=match)


@pytest.mark.parametrize("ballot,weight", [
    (b("a", "1"), 1.0),
    (b("a", "1", conf=0.0, rep=0.0, match=0.0), WEIGHT_FLOOR ** 3),
    (b("a", "1", conf=0.5, rep=1.0, match=1.0), WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * 0.5),
    (b("a", "1", conf=2.0, rep=-1.0, match=1.0), WEIGHT_FLOOR),  # clamped into [0, 1]
])
def test_weight_formula(ballot: Ballot, weight: float) -> None:
    assert ballot_weight(ballot) == pytest.approx(weight)


def test_normalized_answers_pool_their_weight() -> None:
    out = vote([b("a", "42"), b("b", "42.0"), b("c", "**$42**."), b("d", "41")],
               AnswerType.NUMBER)
    assert out.winner == "42"
    assert [(r.answer, r.count) for r in out.rows] == [("42", 3), ("41", 1)]
    assert out.rows[0].share == pytest.approx(0.75)
    assert out.agrees("a") and not out.agrees("d")


def test_reputation_and_confidence_outweigh_numbers() -> None:
    ballots = [b("honest", "7", conf=0.95, rep=0.9),
               b("sybil1", "8", conf=0.2, rep=0.05), b("sybil2", "8", conf=0.2, rep=0.05)]
    assert vote(ballots, AnswerType.NUMBER).winner == "7"


def test_match_score_weighs_in() -> None:
    ballots = [b("fit", "A", match=1.0), b("unfit", "B", match=0.3)]
    assert vote(ballots, AnswerType.CHOICE, ("x", "y")).winner == "A"


def test_unparseable_answers_weigh_nothing_but_are_listed() -> None:
    out = vote([b("a", "no idea"), b("b", "3", conf=0.1)], AnswerType.NUMBER)
    assert out.winner == "3"
    bad = next(s for s in out.ballots if s.ballot.executor == "a")
    assert bad.normalized is None and bad.weight == 0.0
    assert vote([b("a", "???")], AnswerType.NUMBER).winner is None


@pytest.mark.parametrize("ballots,winner", [
    ([b("a", "1"), b("b", "2")], "1"),  # equal weight, equal count: smallest answer
    # equal total weight (0.5 + 0.5 against 1.0): more ballots win
    ([b("a", "2", conf=0.45 / 0.95), b("b", "2", conf=0.45 / 0.95), b("c", "1")], "2"),
    ([b("a", "yes"), b("b", "no")], "no"),
])
def test_ties_are_deterministic_in_any_order(ballots: list[Ballot], winner: str) -> None:
    answer_type = AnswerType.TEXT if winner in ("yes", "no") else AnswerType.NUMBER
    for perm in itertools.permutations(ballots):
        assert vote(list(perm), answer_type).winner == winner


def test_empty_vote() -> None:
    out = vote([], AnswerType.TEXT)
    assert out.winner is None and out.rows == () and out.total_weight == 0.0
