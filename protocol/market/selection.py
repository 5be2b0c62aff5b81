"""Executor selection: which k of the bidders get a task.

A selector ranks :class:`Candidate` s (one per valid bid, with the bidder's ledger reputation)
and returns the ``n`` it picks, best first. It never returns a peer twice; the auction has
already removed the requester itself (unless asked) and peers already tried on this task.

Two selectors share the :class:`Selector` protocol:

* :class:`ScoreSelector` (Symphony): a fixed weighted sum, documented below.
* ``protocol.market.linucb.LinUCBSelector`` (Symphony-Coord): a contextual bandit that learns from
  rewards reported after voting (and verification) through ``observe``.

:class:`ExploringSelector` wraps either so that peers it never picked get a bounded share of
the picks (a newcomer cannot otherwise outrank peers with a record).

Score formula (every term in [0, 1]; the weights, :class:`ScoreWeights`, sum to 1)::

    score = match      * match_score
          + reputation * reputation
          + price      * (1 - price / max_price)          (1 when max_price is 0)
          + latency    * (1 - min(1, est_latency / deadline))

Ties are broken by peer id, so the choice is deterministic.

Independence: given ``group_of`` (a peer's praise group, ``protocol.ledger.trust``: identities
that vouch for each other in the ledger, likely one operator), the score selector picks
greedily and lowers a candidate's score by ``ScoreWeights.independence`` for every executor of its
group already picked. A coalition that may otherwise fill all k seats of a task with its own
members, and so outvote everyone, then gets one seat unless no independent bidder comes close.
The reputation in a candidate is the requester's earned reputation (a track record from
observers it trusts), so colluders that praise each other gain nothing in the ranking either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


def assignment_ms(base_ms: int, slack: float, est_latency_ms: int, left_ms: int) -> int:
    """How long the picked bidder gets to deliver: a fixed base plus ``slack`` times its own
    latency estimate (a slow machine that says so gets room, and a bid that understates its
    latency runs out of it), never past the ``left_ms`` the task or job has left. The task
    market and the rollout auction both give this deadline."""
    return min(left_ms, base_ms + int(slack * est_latency_ms))


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
    """The score's weights (they sum to one) and the independence penalty."""

    match: float = 0.4
    reputation: float = 0.3
    price: float = 0.15
    latency: float = 0.15
    #: score subtracted per executor of the candidate's praise group already picked for the task
    independence: float = 0.3


class ScoreSelector:
    """Rank by the documented weighted score, preferring independent executors when
    ``group_of`` names each peer's group; stateless, so ``observe`` does nothing."""

    def __init__(self, weights: ScoreWeights = ScoreWeights(),
                 group_of: Callable[[str], str] | None = None) -> None:
        self.weights = weights
        self.group_of = group_of

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
        if self.group_of is None:
            return ranked[: max(0, n)]
        return independent(ranked, n, self.score, self.group_of, self.weights.independence)

    def observe(self, task_id: bytes, peer: str, reward: float) -> None:
        return None


#: share of a selector's picks that may go to peers it has not picked yet
EXPLORE_SHARE = 0.1
#: peers an exploring selector remembers having picked (the oldest are forgotten first)
MAX_TRIED = 4096


class ExploringSelector:
    """Wraps a selector so that new peers get a bounded share of the picks.

    A deterministic score, or a bandit whose known arms have earned a high mean, never picks a
    peer with no record once honest peers have built one: a newcomer could never earn its
    own. This wrapper lets the inner selector choose, then, while at most ``share`` of its
    picks so far went to exploration, gives the last seat of a pick to the best-ranked
    candidate (by the inner selector) it has never picked, when one bid. So at most ``share``
    of all picks are exploratory, and a newcomer waits at most about ``1 / share`` picks.
    Its caught or rewarded work then feeds reputation and ``observe`` as any other pick's."""

    def __init__(self, inner: Selector, share: float = EXPLORE_SHARE,
                 max_tried: int = MAX_TRIED) -> None:
        if not 0.0 <= share <= 1.0 or max_tried < 1:
            raise ValueError(f"exploration share must be in [0, 1] (got {share}) and "
                             f"max_tried >= 1 (got {max_tried})")
        self.inner, self.share, self.max_tried = inner, share, max_tried
        self.tried: dict[str, None] = {}  # insertion-ordered set of peers picked
        self.picks = 0
        self.explored = 0

    def select(self, task_id: bytes, candidates: Sequence[Candidate], n: int) -> list[Candidate]:
        picked = self.inner.select(task_id, candidates, n)
        if not picked:
            return picked
        self.picks += 1
        chosen = {c.peer for c in picked}
        fresh = [c for c in unique(candidates) if c.peer not in self.tried and c.peer not in chosen]
        if fresh and self.explored + 1 <= self.share * self.picks:
            newcomer = self.inner.select(task_id, fresh, 1)
            if newcomer:
                keep = picked if len(picked) < n else picked[:n - 1]
                picked = [*keep, newcomer[0]]
                self.explored += 1
        for c in picked:
            self.tried.pop(c.peer, None)
            self.tried[c.peer] = None
        while len(self.tried) > self.max_tried:
            del self.tried[next(iter(self.tried))]
        return picked

    def observe(self, task_id: bytes, peer: str, reward: float) -> None:
        self.inner.observe(task_id, peer, reward)


def independent(
    ranked: Sequence[Candidate],
    n: int,
    score: Callable[[Candidate], float],
    group_of: Callable[[str], str],
    penalty: float,
) -> list[Candidate]:
    """Pick ``n`` greedily, each at its score less ``penalty`` per pick of its group so far."""
    groups = {c.peer: group_of(c.peer) for c in ranked}
    taken: dict[str, int] = {}
    left = list(ranked)
    picked: list[Candidate] = []
    while left and len(picked) < n:
        best = min(left, key=lambda c: (-(score(c) - penalty * taken.get(groups[c.peer], 0)),
                                        c.peer))
        left.remove(best)
        picked.append(best)
        taken[groups[best.peer]] = taken.get(groups[best.peer], 0) + 1
    return picked


def unique(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per peer (the first seen)."""
    seen: set[str] = set()
    out: list[Candidate] = []
    for c in candidates:
        if c.peer not in seen:
            seen.add(c.peer)
            out.append(c)
    return out
