"""LinUCB contextual bandit (Li et al. 2010, disjoint arms) with delayed rewards.

Each arm (a peer id) keeps a ridge-regression estimate of reward given a context vector ``x``:
``A = lambda*I + sum x x^T``, ``b = sum r x``, ``theta = A^-1 b``. Its upper confidence bound

    ucb(x) = theta . x + alpha * sqrt(x^T A^-1 x)

is what ``choose`` ranks by (ties by arm id, so choices are deterministic). ``A^-1`` is kept
directly and updated with Sherman-Morrison, O(d^2) per reward, in pure Python.

Rewards arrive later (after voting, maybe after verification): ``choose(task_id, ...)`` stores
the context it saw for each chosen arm under the task id, and ``reward(task_id, arm, r)``
matches it back, updates the arm once, and forgets it. Unknown or repeated rewards are ignored.

Defaults: ``alpha = 1.0`` (exploration weight; the theory's 1 + sqrt(ln(2/delta)/2) is ~2.4 for
delta = 0.05, which explores too long for a few dozen peers) and ``lambda = 1.0`` (ridge
prior: an unseen arm's ``A^-1 = I``, so its bonus starts at ``alpha * |x|``).

State is bounded (``max_arms`` least-recently-used arms, ``max_pending`` oldest tasks) and
round-trips through ``to_dict`` / ``from_dict`` as plain JSON-able data for SQLite.

For task selection (:class:`LinUCBSelector`) the context is, for each bidder::

    x = [1, match_score, reputation, 1 - load, speed, cheapness]

with ``speed`` and ``cheapness`` from protocol.market.selection (all in [0, 1]).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protocol.market.selection import Candidate, cheapness, speed, unique

DEFAULT_ALPHA = 1.0
DEFAULT_LAMBDA = 1.0
MAX_ARMS = 4096
MAX_PENDING = 1024
STATE_VERSION = 1
FEATURES = ("bias", "match_score", "reputation", "availability", "speed", "cheapness")


@dataclass(slots=True)
class Arm:
    a_inv: list[list[float]]
    b: list[float]
    pulls: int
    last_used: int


def _identity(d: int, scale: float) -> list[list[float]]:
    return [[scale if i == j else 0.0 for j in range(d)] for i in range(d)]


def _matvec(m: list[list[float]], x: Sequence[float]) -> list[float]:
    return [sum(row[j] * x[j] for j in range(len(x))) for row in m]


def _dot(u: Sequence[float], v: Sequence[float]) -> float:
    return sum(a * b for a, b in zip(u, v, strict=True))


class LinUCB:
    def __init__(
        self,
        dim: int,
        *,
        alpha: float = DEFAULT_ALPHA,
        ridge: float = DEFAULT_LAMBDA,
        max_arms: int = MAX_ARMS,
        max_pending: int = MAX_PENDING,
    ) -> None:
        if dim < 1 or alpha < 0 or ridge <= 0 or max_arms < 1 or max_pending < 1:
            raise ValueError("LinUCB needs dim >= 1, alpha >= 0, ridge > 0 and positive caps")
        self.dim = dim
        self.alpha = alpha
        self.ridge = ridge
        self.max_arms = max_arms
        self.max_pending = max_pending
        self.arms: dict[str, Arm] = {}
        #: task id (hex) -> arm -> context it was chosen with; insertion order = age
        self.pending: dict[str, dict[str, list[float]]] = {}
        self._clock = 0

    # ------------------------------------------------------------------ model

    def _arm(self, arm: str) -> Arm:
        state = self.arms.get(arm)
        if state is None:
            state = Arm(_identity(self.dim, 1.0 / self.ridge), [0.0] * self.dim, 0, self._clock)
            self.arms[arm] = state
            if len(self.arms) > self.max_arms:
                oldest = min(self.arms, key=lambda k: (self.arms[k].last_used, k))
                del self.arms[oldest]
        return state

    def _check(self, x: Sequence[float]) -> None:
        if len(x) != self.dim or not all(math.isfinite(v) for v in x):
            raise ValueError(f"context must be {self.dim} finite numbers")

    def theta(self, arm: str) -> list[float]:
        state = self.arms.get(arm)
        if state is None:
            return [0.0] * self.dim
        return _matvec(state.a_inv, state.b)

    def ucb(self, arm: str, x: Sequence[float]) -> float:
        self._check(x)
        state = self.arms.get(arm)
        if state is None:  # an unseen arm: theta = 0, A^-1 = I / ridge
            return self.alpha * math.sqrt(_dot(x, x) / self.ridge)
        ax = _matvec(state.a_inv, x)
        mean = _dot(_matvec(state.a_inv, state.b), x)
        return mean + self.alpha * math.sqrt(max(0.0, _dot(x, ax)))

    def update(self, arm: str, x: Sequence[float], reward: float) -> None:
        self._check(x)
        if not math.isfinite(reward):
            raise ValueError("reward must be finite")
        state = self._arm(arm)
        ax = _matvec(state.a_inv, x)  # A^-1 x (A^-1 is symmetric, so also x^T A^-1)
        denom = 1.0 + _dot(x, ax)
        for i in range(self.dim):
            row = state.a_inv[i]
            for j in range(self.dim):
                row[j] -= ax[i] * ax[j] / denom
        for i in range(self.dim):
            state.b[i] += reward * x[i]
        state.pulls += 1

    # ------------------------------------------------------------------ choosing with delay

    def choose(self, task_id: bytes, contexts: Mapping[str, Sequence[float]], n: int) -> list[str]:
        """The ``n`` arms with the highest UCB; remembers their contexts under ``task_id``."""
        ranked = sorted(contexts, key=lambda a: (-self.ucb(a, contexts[a]), a))[: max(0, n)]
        self._clock += 1
        key = task_id.hex()
        pending = self.pending.setdefault(key, {})
        for arm in ranked:
            self._arm(arm).last_used = self._clock
            pending[arm] = [float(v) for v in contexts[arm]]
        while len(self.pending) > self.max_pending:
            del self.pending[next(iter(self.pending))]
        return ranked

    def reward(self, task_id: bytes, arm: str, reward: float) -> bool:
        """Apply a delayed reward; False when nothing is pending for (task, arm)."""
        key = task_id.hex()
        pending = self.pending.get(key)
        if pending is None or arm not in pending:
            return False
        x = pending.pop(arm)
        if not pending:
            del self.pending[key]
        self.update(arm, x, reward)
        return True

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, object]:
        return {
            "version": STATE_VERSION,
            "dim": self.dim,
            "alpha": self.alpha,
            "ridge": self.ridge,
            "clock": self._clock,
            "arms": {
                k: {"a_inv": a.a_inv, "b": a.b, "pulls": a.pulls, "last_used": a.last_used}
                for k, a in self.arms.items()
            },
            "pending": self.pending,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object], **caps: int) -> LinUCB:
        """Rebuild from ``to_dict`` output; raises ValueError for anything malformed."""
        try:
            if data["version"] != STATE_VERSION:
                raise ValueError(f"LinUCB state version {data['version']!r} is not supported")
            dim, alpha, ridge, clock = data["dim"], data["alpha"], data["ridge"], data["clock"]
            if not isinstance(dim, int) or not isinstance(clock, int):
                raise ValueError("dim and clock must be ints")
            if not isinstance(alpha, (int, float)) or not isinstance(ridge, (int, float)):
                raise ValueError("alpha and ridge must be numbers")
            model = cls(dim, alpha=float(alpha), ridge=float(ridge), **caps)
            model._clock = clock
            arms = data["arms"]
            pending = data["pending"]
            if not isinstance(arms, Mapping) or not isinstance(pending, Mapping):
                raise ValueError("arms and pending must be mappings")
            for key, arm in arms.items():
                a_inv = [[float(v) for v in row] for row in arm["a_inv"]]
                b = [float(v) for v in arm["b"]]
                if len(a_inv) != dim or any(len(r) != dim for r in a_inv) or len(b) != dim:
                    raise ValueError(f"arm {key!r} has the wrong shape")
                model.arms[str(key)] = Arm(a_inv, b, int(arm["pulls"]), int(arm["last_used"]))
            for task, chosen in pending.items():
                ctxs = {str(a): [float(v) for v in x] for a, x in chosen.items()}
                for x in ctxs.values():
                    model._check(x)
                model.pending[str(task)] = ctxs
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed LinUCB state: {exc!r}") from None
        return model


def features(c: Candidate) -> list[float]:
    """The selection context of one bidder (see the module docstring)."""
    rep = min(1.0, max(0.0, c.reputation))
    return [1.0, c.match_score, rep, 1.0 - c.load, speed(c), cheapness(c)]


class LinUCBSelector:
    """The task-market selector backed by a :class:`LinUCB` over :func:`features`."""

    def __init__(self, model: LinUCB | None = None) -> None:
        self.model = model if model is not None else LinUCB(len(FEATURES))
        self._check(self.model)

    @staticmethod
    def _check(model: LinUCB) -> None:
        if model.dim != len(FEATURES):
            raise ValueError(f"a selection model has {len(FEATURES)} features")

    def load(self, model: LinUCB) -> None:
        """Choose by ``model`` from now on (a saved state restored into the selector a machine
        already holds)."""
        self._check(model)
        self.model = model

    def select(self, task_id: bytes, candidates: Sequence[Candidate], n: int) -> list[Candidate]:
        by_peer = {c.peer: c for c in unique(candidates)}
        chosen = self.model.choose(task_id, {p: features(c) for p, c in by_peer.items()}, n)
        return [by_peer[p] for p in chosen]

    def observe(self, task_id: bytes, peer: str, reward: float) -> None:
        self.model.reward(task_id, peer, min(1.0, max(0.0, reward)))
