"""CoT weighted voting: combine several executors' answers into one.

Every answer is first normalized for the task's answer type with
``protocol.answers.normalize_answer``; an answer that does not normalize is an *invalid*
ballot: it is listed but weighs nothing. Each valid ballot weighs

    weight     = f(reputation) * f(confidence') * f(match_score)
    confidence'= min(confidence, reputation)
    f(v)       = WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * clamp(v, 0, 1)

reputation is the executor's *earned* reputation as the requester sees it: its track record
weighted by how far the requester trusts each observer (``protocol.ledger.trust``; 0.5 for an
executor nobody trusted has seen). confidence is the executor's own claim, match_score how
well its model fit the task (Symphony weights each CoT by its executor's match score). The
floor keeps a zero in one factor from silencing a ballot entirely, so three agreeing
zero-confidence answers still beat nothing.

The attack this answers: weighting by claimed confidence as claimed lets an executor buy
influence for free by claiming 1.0 (measured by the voting scenario: confidently-wrong
colluders took k = 3 weighted voting down to 6% correct). Here a claim counts only up to the
executor's track record: an executor that wins half its votes weighs as if it claimed at most
0.5, however sure it says it is, and a newcomer counts as an executor with an even record.
One executor's weight is thus capped by its record, and a group whose record comes only from
praising itself has no trusted record (``protocol.ledger.trust``), so its members weigh as
newcomers. A calibrated executor loses nothing: its low-confidence answers keep their low
weight and its confident ones weigh what its record has earned (up to ``CONFIDENCE_SLACK``
above it, so a calibrated executor's confidence still separates its answers).

The record is what the requester attests after each vote, and an executor's answer counts as
right (``completed``) only when the *other* executors' ballots confirm it
(``VoteOutcome.confirmed``): no executor can raise its own record by outweighing the others,
which would otherwise let a confident executor that wins a few early votes weigh more, win
more, and lock itself in (measured: with that loop, executors always giving the most common
wrong answer ended with the best records at k = 3).

The winner is the normalized answer with the largest total weight; ties go to the answer with
more ballots, then to the smallest answer string, so every node computes the same outcome
from the same ballots in any order.

Votes over plans (``plan_vote``): in plan mode each plan's final answer is one ballot, voted
by the same rule, with the plan's match (the geometric mean of its steps' executors' match
scores, ``plan_match``) in place of one executor's match: Symphony weights each chain of
thought by how well its executors matched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protocol.answers import AnswerType, normalize_answer

WEIGHT_FLOOR = 0.05
#: how far a claimed confidence may exceed the executor's record before it stops counting
CONFIDENCE_SLACK = 0.3


@dataclass(frozen=True, slots=True)
class Ballot:
    executor: str
    answer: str
    confidence: float
    reputation: float
    match_score: float


@dataclass(frozen=True, slots=True)
class ScoredBallot:
    ballot: Ballot
    #: the normalized answer, None when the raw answer did not normalize
    normalized: str | None
    weight: float


@dataclass(frozen=True, slots=True)
class VoteRow:
    answer: str
    weight: float
    count: int
    voters: tuple[str, ...]
    #: this answer's fraction of the total valid weight
    share: float


@dataclass(frozen=True, slots=True)
class VoteOutcome:
    winner: str | None
    #: one row per distinct normalized answer, winner first
    rows: tuple[VoteRow, ...]
    ballots: tuple[ScoredBallot, ...]
    total_weight: float

    def agrees(self, executor: str) -> bool:
        """Did ``executor`` vote for the winner?"""
        return self.winner is not None and any(
            s.ballot.executor == executor and s.normalized == self.winner for s in self.ballots
        )

    def confirmed(self, executor: str) -> bool:
        """Did the *other* executors' ballots confirm ``executor``'s answer: is it a top answer
        (ties included) by their weight alone? With no other valid ballot: did it win?"""
        mine = next((s for s in self.ballots if s.ballot.executor == executor), None)
        if mine is None or mine.normalized is None:
            return False
        totals: dict[str, float] = {}
        for s in self.ballots:
            if s.normalized is not None and s.ballot.executor != executor:
                totals[s.normalized] = totals.get(s.normalized, 0.0) + s.weight
        if not totals:
            return self.winner == mine.normalized
        own = totals.get(mine.normalized, 0.0)
        return own > 0.0 and round(own, 12) >= round(max(totals.values()), 12)


def weight_factor(v: float) -> float:
    """One factor of a ballot's weight: ``v`` clamped to [0, 1], floored at WEIGHT_FLOOR."""
    return WEIGHT_FLOOR + (1.0 - WEIGHT_FLOOR) * min(1.0, max(0.0, v))


def calibrated_confidence(b: Ballot) -> float:
    """The confidence a ballot is allowed: its claim, capped by the executor's record."""
    return min(b.confidence, b.reputation + CONFIDENCE_SLACK)


def ballot_weight(b: Ballot) -> float:
    return (weight_factor(b.reputation) * weight_factor(calibrated_confidence(b))
            * weight_factor(b.match_score))


@dataclass(frozen=True, slots=True)
class VoteRule:
    """How the requester's vote weighs a ballot, and whether an executor's answer must be
    confirmed by the other executors' ballots to be attested completed (else: it agrees with
    the winner). The protocol's rule is the default; the voting scenario measures it against
    the former one (ballot weight as claimed, not confirmed by others) by giving its comparison
    runs' auctions another ``VoteRule``."""

    weigh: Callable[[Ballot], float] = ballot_weight
    confirm_by_others: bool = True


def vote(
    ballots: Sequence[Ballot],
    answer_type: AnswerType,
    choices: Sequence[str] = (),
    weigh: Callable[[Ballot], float] = ballot_weight,
) -> VoteOutcome:
    """Normalize, weigh and count ``ballots``; deterministic in their order and content.

    ``weigh`` is the protocol's rule; a simulation may pass another to measure against it."""
    scored: list[ScoredBallot] = []
    for b in sorted(ballots, key=lambda b: (b.executor, b.answer)):
        normalized = normalize_answer(answer_type, b.answer, tuple(choices))
        weight = weigh(b) if normalized is not None else 0.0
        scored.append(ScoredBallot(b, normalized, weight))
    totals: dict[str, list[ScoredBallot]] = {}
    for s in scored:
        if s.normalized is not None:
            totals.setdefault(s.normalized, []).append(s)
    total = sum(s.weight for s in scored)
    rows = [
        VoteRow(
            answer=answer,
            weight=sum(s.weight for s in group),
            count=len(group),
            voters=tuple(s.ballot.executor for s in group),
            share=(sum(s.weight for s in group) / total) if total > 0 else 0.0,
        )
        for answer, group in totals.items()
    ]
    # round the weight for ordering so float summation order can never flip a tie
    rows.sort(key=lambda r: (-round(r.weight, 12), -r.count, r.answer))
    return VoteOutcome(
        winner=rows[0].answer if rows else None,
        rows=tuple(rows),
        ballots=tuple(scored),
        total_weight=total,
    )


# ---------------------------------------------------------------- votes over plans


@dataclass(frozen=True, slots=True)
class PlanBallot:
    """One plan's final answer as it enters the vote over plans (Symphony's third phase)."""

    #: the plan's key in the vote (its planner: one plan per planner), unique per vote
    plan: str
    #: the executor of the plan's final step, whose answer this is
    executor: str
    answer: str
    confidence: float
    #: the final executor's earned reputation, as in a task's vote
    reputation: float
    #: the match score of each step's executor to its step's requirement, in step order
    step_matches: tuple[float, ...]


def plan_match(step_matches: Sequence[float]) -> float:
    """A plan's match: the geometric mean of its steps' match scores, each clamped to [0, 1].

    The geometric mean, not the arithmetic: a chain of steps is only as sound as its links,
    so one badly matched step (an arithmetic step sent to an agent without the skill) pulls
    the plan down more than a well matched step lifts it, and a step that matched nothing
    makes the whole plan's match 0 (still weighed at the floor by ``ballot_weight``).
    Independent of the number of steps, so a longer plan is neither favored nor penalized."""
    if not step_matches:
        raise ValueError("a plan has at least one step")
    clamped = [min(1.0, max(0.0, m)) for m in step_matches]
    if min(clamped) == 0.0:
        return 0.0
    return math.exp(math.fsum(math.log(m) for m in clamped) / len(clamped))


def plan_ballot(p: PlanBallot) -> Ballot:
    """The plan as a ballot of the task's vote: its final executor's reputation and
    confidence, and the plan's match (:func:`plan_match`) in place of one executor's match,
    so its weight is ``ballot_weight``: f(reputation) * f(confidence') * f(plan match).
    The ballot's voter is the plan's key, so ``VoteOutcome.confirmed`` asks whether the
    *other plans* confirm this plan's answer."""
    return Ballot(executor=p.plan, answer=p.answer, confidence=p.confidence,
                  reputation=p.reputation, match_score=plan_match(p.step_matches))


def plan_vote(plans: Sequence[PlanBallot], answer_type: AnswerType,
              choices: Sequence[str] = ()) -> VoteOutcome:
    """The vote over plans: every plan's final answer, weighed by :func:`plan_ballot`, counted
    by :func:`vote` (normalization, ties and order as for a task's executors)."""
    keys = [p.plan for p in plans]
    if len(set(keys)) != len(keys):
        raise ValueError("plan keys repeat")
    return vote([plan_ballot(p) for p in plans], answer_type, choices)
