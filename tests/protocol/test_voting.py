"""Weighted voting: the documented weight, normalization, deterministic ties, the vote table."""

from __future__ import annotations

import itertools

import pytest

from protocol.answers import AnswerType
from protocol.market.voting import (
    CONFIDENCE_SLACK,
    WEIGHT_FLOOR,
    Ballot,
    ballot_weight,
    calibrated_confidence,
    vote,
)


def b(executor: str, answer: str, conf: float = 1.0, rep: float = 1.0,
      match: float = 1.0) -> Ballot:
    return Ballot(executor=executor, answer=answer, confidence=conf, reputation=rep,
                  match_score=match)


@pytest.mark.parametrize("ballot,weight", [
    (b("a", "1"), 1.0),
    (b("a", "1", conf=0.0, rep=0.0, match=0.0), WEIGHT_FLOOR ** 3),
    (b("a", "1", conf=0.5, rep=1.0, match=1.0), WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * 0.5),
    # clamped into [0, 1]; the claim is capped by the record (-1) plus the slack first
    (b("a", "1", conf=2.0, rep=-1.0, match=1.0), WEIGHT_FLOOR ** 2),
    # a claim above the record plus the slack counts as that
    (b("a", "1", conf=1.0, rep=0.5, match=1.0),
     (WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * 0.5)
     * (WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * (0.5 + CONFIDENCE_SLACK))),
    # a claim below it counts as claimed
    (b("a", "1", conf=0.2, rep=0.8, match=1.0),
     (WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * 0.8) * (WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * 0.2)),
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


def test_confidence_counts_only_up_to_the_track_record() -> None:
    assert calibrated_confidence(b("a", "1", conf=1.0, rep=0.3)) == 0.3 + CONFIDENCE_SLACK
    assert calibrated_confidence(b("a", "1", conf=0.2, rep=0.9)) == 0.2
    # two confidently-wrong colluders with a poor record against one calibrated executor with
    # a good one: claimed at face value (the former rule) they would outweigh it
    colluders = [b("c1", "13", conf=1.0, rep=0.45), b("c2", "13", conf=1.0, rep=0.45)]
    honest = b("h", "7", conf=0.95, rep=0.85)
    assert vote([*colluders, honest], AnswerType.NUMBER).winner == "7"

    def face_value(x: Ballot) -> float:
        f = [WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * v for v in (x.reputation, x.confidence)]
        return f[0] * f[1]

    assert vote([*colluders, honest], AnswerType.NUMBER, weigh=face_value).winner == "13"


def test_a_newcomers_claim_counts_only_up_to_an_even_record_plus_the_slack() -> None:
    top = 0.5 + CONFIDENCE_SLACK
    sure, capped = b("new1", "1", conf=1.0, rep=0.5), b("new2", "2", conf=top, rep=0.5)
    assert ballot_weight(sure) == ballot_weight(capped)
    assert ballot_weight(b("new3", "3", conf=top - 0.1, rep=0.5)) < ballot_weight(capped)


@pytest.mark.parametrize("answers,confirmed", [
    # two agree, one dissents: the two confirm each other (each ties the dissenter among the
    # others, and a tie confirms), nobody confirms the dissenter
    ({"a": "42", "b": "42", "c": "41"}, {"a", "b"}),
    # all different: nobody is confirmed, not even the winner
    ({"a": "1", "b": "2", "c": "3"}, set()),
    # an even split: each side is outvoted by the others
    ({"a": "1", "b": "1", "c": "2", "d": "2"}, set()),
    # alone: confirmed when valid (it won)
    ({"a": "5"}, {"a"}),
    ({"a": "what"}, set()),
])
def test_an_answer_is_confirmed_by_the_others_not_by_itself(
        answers: dict[str, str], confirmed: set[str]) -> None:
    out = vote([b(e, a) for e, a in answers.items()], AnswerType.NUMBER)
    assert {e for e in answers if out.confirmed(e)} == confirmed
    assert not out.confirmed("nobody")


def test_a_heavy_ballot_cannot_confirm_itself() -> None:
    # the confident executor wins the vote, but nobody else gave its answer
    out = vote([b("heavy", "9", conf=1.0, rep=1.0), b("x", "7", conf=0.2, rep=0.3),
                b("y", "7", conf=0.2, rep=0.3)], AnswerType.NUMBER)
    assert out.winner == "9" and out.agrees("heavy")
    assert not out.confirmed("heavy")
    # the two light ones confirm each other only where the heavy one does not outweigh them
    out = vote([b("heavy", "9", conf=0.3, rep=0.5), b("x", "7", conf=0.9, rep=0.8),
                b("y", "7", conf=0.9, rep=0.8)], AnswerType.NUMBER)
    assert out.confirmed("x") and out.confirmed("y") and not out.confirmed("heavy")


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
