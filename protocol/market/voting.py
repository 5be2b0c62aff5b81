"""CoT weighted voting: combine several executors' answers into one.

Every answer is first normalized for the task's answer type with
``protocol.answers.normalize_answer``; an answer that does not normalize is an *invalid*
ballot: it is listed but weighs nothing. Each valid ballot weighs

    weight = f(reputation) * f(confidence) * f(match_score)
    f(v)   = WEIGHT_FLOOR + (1 - WEIGHT_FLOOR) * clamp(v, 0, 1)

reputation is the executor's ledger reputation, confidence the executor's own answer
confidence, match_score how well its model fit the task (Symphony weights each CoT by its
executor's match score). The floor keeps a zero in one factor from silencing a ballot
entirely, so three agreeing zero-confidence answers still beat nothing.

The winner is the normalized answer with the largest total weight; ties go to the answer with
more ballots, then to the smallest answer string, so every node computes the same outcome
from the same ballots in any order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocol.answers import AnswerType, normalize_answer

WEIGHT_FLOOR = 0.05


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


def _factor(v: float) -> float:
    return WEIGHT_FLOOR + (1.0 - WEIGHT_FLOOR) * min(1.0, max(0.0, v))


def ballot_weight(b: Ballot) -> float:
    return _factor(b.reputation) * _factor(b.confidence) * _factor(b.match_score)


def vote(
    ballots: Sequence[Ballot], answer_type: AnswerType, choices: Sequence[str] = ()
) -> VoteOutcome:
    """Normalize, weigh and count ``ballots``; deterministic in their order and content."""
    scored: list[ScoredBallot] = []
    for b in sorted(ballots, key=lambda b: (b.executor, b.answer)):
        normalized = normalize_answer(answer_type, b.answer, tuple(choices))
        weight = ballot_weight(b) if normalized is not None else 0.0
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
