"""Executor selection: which k of the bidders get a task.

A selector ranks :class:`Candidate` s (one per valid bid, with the bidder's ledger reputation)
and returns the ``n`` it picks, best first. It never returns a peer twice; the auction has
already removed the requester itself (unless asked) and peers already tried on this task.

Two selectors share the :class:`Selector` protocol:

* :class:`ScoreSelector` (Symphony): a fixed weighted sum, documented below.
* ``protocol.market.linucb.LinUCBSelector`` (Symphony-Coord): a contextual bandit that learns from
  rewards reported after voting (and verification) through ``observe``.

Score formula (every term in [0, 1], weights sum to 1)::

    score = W_MATCH   * match_score
          + W_REP     * reputation
          + W_PRICE   * (1 - price / max_price)          (1 when max_price is 0)
          + W_LATENCY * (1 - min(1, est_latency / deadline))

Ties are broken by peer id, so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

W_MATCH = 0.4
W_REP = 0.3
W_PRICE = 0.15
W_LATENCY = 0.15


@dataclass(frozen=True, slots=True)
class Candidate:
    peer: str
    match_score: float
    reputation: float
    price: float
    max_price: float
    est_latency_ms: int
    #: time left for the task when the auction closes
    deadline_ms: int
    load: float
    free_slots: int


def cheapness(c: Candidate) -> float:
    if c.max_price <= 0.0:
        return 1.0
    return max(0.0, 1.0 - c.price / c.max_price)


def speed(c: Candidate) -> float:
    if c.deadline_ms <= 0:
        return 0.0
    return max(0.0, 1.0 - min(1.0, c.est_latency_ms / c.deadline_ms))


class Selector(Protocol):
    def select(self, task_id: bytes, candidates: Sequence[Candidate], n: int) -> list[Candidate]:
        """Pick up to ``n`` distinct candidates, best first."""
        ...

    def observe(self, task_id: bytes, peer: str, reward: float) -> None:
        """Reward in [0, 1] for ``peer``'s work on ``task_id`` (ignored if unknown)."""
        ...


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    match: float = W_MATCH
    reputation: float = W_REP
    price: float = W_PRICE
    latency: float = W_LATENCY


class ScoreSelector:
    """Rank by the documented weighted score; stateless, so ``observe`` does nothing."""

    def __init__(self, weights: ScoreWeights = ScoreWeights()) -> None:
        self.weights = weights

    def score(self, c: Candidate) -> float:
        w = self.weights
        rep = min(1.0, max(0.0, c.reputation))
        return (
            w.match * c.match_score
            + w.reputation * rep
            + w.price * cheapness(c)
            + w.latency * speed(c)
        )

    def select(self, task_id: bytes, candidates: Sequence[Candidate], n: int) -> list[Candidate]:
        ranked = sorted(unique(candidates), key=lambda c: (-self.score(c), c.peer))
        return ranked[: max(0, n)]

    def observe(self, task_id: bytes, peer: str, reward: float) -> None:
        return None


def unique(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per peer (the first seen)."""
    seen: set[str] = set()
    out: list[Candidate] = []
    for c in candidates:
        if c.peer not in seen:
            seen.add(c.peer)
            out.append(c)
    return out
