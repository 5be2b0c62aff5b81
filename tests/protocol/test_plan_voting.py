"""The vote over plans: a plan's weight includes its steps' match scores (plan_match)."""

from __future__ import annotations

import math

import pytest

from protocol.answers import AnswerType
from protocol.market.voting import (
    WEIGHT_FLOOR,
    Ballot,
    PlanBallot,
    ballot_weight,
    plan_ballot,
    plan_match,
    plan_vote,
)


def f(v: float) -> float:
    return WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * v


def p(plan: str, answer: str, matches: tuple[float, ...], *, executor: str = "x",
      conf: float = 1.0, rep: float = 1.0) -> PlanBallot:
    return PlanBallot(plan=plan, executor=executor, answer=answer, confidence=conf,
                      reputation=rep, step_matches=matches)


@pytest.mark.parametrize("matches, expected", [
    ((1.0,), 1.0),
    ((0.5,), 0.5),
    ((1.0, 1.0, 1.0), 1.0),
    ((0.25, 1.0), 0.5),                      # geometric: sqrt(0.25 * 1)
    ((0.5, 0.5, 0.5, 0.5), 0.5),             # independent of the number of steps
    ((0.9, 0.0, 0.9), 0.0),                  # a step that matched nothing sinks the plan
    ((0.8, 0.2), 0.4),                       # arithmetic mean would give 0.5
    ((2.0, 0.25), 0.5),                      # clamped into [0, 1] first
    ((-1.0, 1.0), 0.0),
])
def test_plan_match_is_the_geometric_mean_of_step_matches(
        matches: tuple[float, ...], expected: float) -> None:
    assert plan_match(matches) == pytest.approx(expected, abs=1e-12)


def test_a_plan_without_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one step"):
        plan_match(())


@pytest.mark.parametrize("ballot, weight", [
    (p("a", "1", (1.0, 1.0)), 1.0),
    (p("a", "1", (0.25, 1.0)), f(0.5)),
    (p("a", "1", (0.0,)), WEIGHT_FLOOR),
    (p("a", "1", (1.0,), conf=0.0, rep=0.0), WEIGHT_FLOOR ** 2),
    # the final executor's claim is capped by its record, as in a task's vote
    (p("a", "1", (0.64, 1.0), conf=1.0, rep=0.2), f(0.2) * f(0.5) * f(0.8)),
])
def test_plan_weight_is_the_final_executors_weight_times_the_plans_match(
        ballot: PlanBallot, weight: float) -> None:
    got = plan_ballot(ballot)
    assert got == Ballot(executor="a", answer="1", confidence=ballot.confidence,
                         reputation=ballot.reputation, match_score=plan_match(ballot.step_matches))
    assert ballot_weight(got) == pytest.approx(weight, abs=1e-12)


@pytest.mark.parametrize("plans, winner, why", [
    # two well matched plans outweigh three plans whose arithmetic went to non-specialists
    ([p("p1", "42", (1.0, 1.0)), p("p2", "42", (0.9, 1.0)),
      p("p3", "41", (0.1, 1.0)), p("p4", "41", (0.1, 0.9)), p("p5", "41", (0.05, 1.0))],
     "42", "matches outweigh count"),
    # equal matches: the count decides
    ([p("p1", "7", (0.5,)), p("p2", "8", (0.5,)), p("p3", "8", (0.5,))], "8", "count"),
    # one unmatched step sinks a plan to the floor
    ([p("p1", "3", (1.0, 0.0, 1.0)), p("p2", "4", (0.3,))], "4", "zero step"),
    # answers normalize before counting
    ([p("p1", "12.0", (0.5,)), p("p2", " 12 ", (0.5,)), p("p3", "13", (0.9,))], "12", "normalized"),
    # a plan whose answer does not normalize weighs nothing
    ([p("p1", "twelve?", (1.0,)), p("p2", "5", (0.1,))], "5", "invalid ballot"),
])
def test_plan_vote_table(plans: list[PlanBallot], winner: str, why: str) -> None:
    out = plan_vote(plans, AnswerType.NUMBER)
    assert out.winner == winner, why
    assert math.isclose(out.total_weight, sum(s.weight for s in out.ballots))
    assert plan_vote(list(reversed(plans)), AnswerType.NUMBER) == out


def test_plans_are_the_voters_and_confirm_each_other() -> None:
    # the same executor ran the final step of two plans: the plans vote, not the executor
    out = plan_vote([p("p1", "9", (1.0,), executor="e"), p("p2", "9", (0.5,), executor="e"),
                     p("p3", "10", (0.2,), executor="f")], AnswerType.NUMBER)
    assert out.rows[0].voters == ("p1", "p2")
    assert out.confirmed("p1") and out.confirmed("p2") and not out.confirmed("p3")


def test_repeated_plan_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="plan keys repeat"):
        plan_vote([p("p1", "1", (1.0,)), p("p1", "2", (1.0,))], AnswerType.NUMBER)
