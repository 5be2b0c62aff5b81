"""Speculative decoding's rules: which drafted tokens a verification step keeps, and how many
tokens to draft next.

A step of speculative decoding: a cheap drafter proposes ``k`` tokens ``d_1..d_k``; the target
(the whole model, or a chain of servers holding its blocks) runs the pending token and the
``k`` drafts in one pass and returns ``k + 1`` next-token distributions: row ``i`` is the
target's distribution for the position of ``d_{i+1}``, and row ``k`` is the one after ``d_k``.
A rule keeps a prefix of the draft and adds exactly one token of its own (a correction at the
first rejection, or a bonus token when every draft was kept), so every step emits between 1
and ``k + 1`` tokens. The caller rolls the target's caches back to the kept prefix.

Contract
--------
* :func:`accept_greedy`: a draft is kept iff it is the target's top-1; the correction and the
  bonus are the top-1. The output is token-for-token the target's plain greedy decoding.
* :func:`accept_sampling`: standard speculative rejection sampling (Leviathan et al. 2023,
  Chen et al. 2023). Draft ``x`` drawn from the drafter's ``q`` is kept with probability
  ``min(1, p(x) / q(x))``; at the first rejection the correction is drawn from
  ``norm(max(0, p - q))``; when all are kept the bonus is drawn from ``p``. Every emitted token
  is distributed exactly as plain sampling from ``p`` (the target's distribution after
  temperature). A drafter that proposes deterministically (n-gram lookup, greedy drafting)
  passes no ``q``: a point mass at its proposal, for which the same rule is exact too.
* :func:`accept_mars`: margin-aware relaxation of greedy verification (MARS): a draft is also
  kept when it is the target's top-2 and ``p2 / p1`` after temperature exceeds ``theta``
  (default :data:`MARS_THETA`). It is *not* exact: the output may differ from greedy decoding
  wherever the target was nearly undecided between two tokens; it trades that for more kept
  drafts per step. Off by default.
* :func:`choose_k` and :class:`AdaptiveK`: with per-position acceptance rate ``a`` (drafts
  kept independently with probability ``a``, stopping at the first rejection), one step with
  ``k`` drafts emits ``E(k) = (1 - a^(k+1)) / (1 - a)`` tokens in expectation (``k + 1`` when
  ``a = 1``). It costs ``t_draft * k + t_step(k)``, where ``t_step(k)`` is the target's time
  for ``k + 1`` positions: the round trip through the chain (every link's latency) plus the
  compute, ``t_step(k) = base + per_position * (k + 1)``. The chosen ``k`` maximizes tokens
  per unit of time ``E(k) / (t_draft * k + t_step(k))``: long links (a large ``base``) and a
  high acceptance rate call for long drafts; a slow drafter or poor acceptance for short.
  :class:`AdaptiveK` measures ``a``, ``t_draft`` and the two step-time terms as it goes
  (exponentially decayed, so it follows a changing text or network). The drafter is never on
  a step's critical path for longer than the step's own round trip: a ``k`` with
  ``t_draft * k > t_step(k)`` is never chosen (``k_min`` aside).
* Overlap (the lookahead): while the target verifies a draft ``d_1..d_k``, a second drafter
  drafts on as if every draft is kept: first its guess ``g`` of the target's bonus token, then
  the next draft. :func:`reusable_lookahead` says what of it the verdict leaves valid: only
  when the emitted tokens are a prefix of ``d_1..d_k, g, ...`` (every draft kept and the bonus
  guessed: probability ``a^(k+1)``) does what it drafted by then open the next draft;
  otherwise it is dropped. Nothing waits for it. :func:`draft_wait_ms` is the expected
  drafting time left on a step's critical path, with and without overlap. AdaptiveK needs no
  model of it: it measures the drafting each step waited for, which a lookahead shortens.

Pure logic: randomness comes from a ``random.Random`` the caller gives; times are numbers the
caller measured. Distributions are sequences of probabilities (any that sum to a positive
value: they are normalized where sampled).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

#: MARS's default margin: a top-2 draft is kept when p2 / p1 exceeds this
MARS_THETA = 0.9
#: the longest draft :func:`choose_k` considers by default
MAX_DRAFT = 8


class Rule(Enum):
    """Which acceptance rule a speculative session verifies drafts with."""

    GREEDY = "greedy"
    SAMPLING = "sampling"
    MARS = "mars"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One verification step's outcome: ``accepted`` drafts kept, then ``tokens`` to emit (the
    kept drafts followed by the rule's own token)."""

    accepted: int
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopTwo:
    """The target's two most likely tokens at one position and ``ratio`` = p2 / p1 after
    temperature (in [0, 1]), what greedy and MARS verification need of a distribution."""

    first: int
    second: int
    ratio: float


def sample_index(weights: Sequence[float], u: float) -> int:
    """The index ``i`` drawn with probability ``weights[i] / sum(weights)``, by the inverse CDF
    at ``u`` (uniform in [0, 1)). An index of zero weight is never drawn."""
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must lie in [0, 1), got {u}")
    cdf = list(itertools.accumulate(weights))
    if not cdf or not cdf[-1] > 0.0 or not math.isfinite(cdf[-1]):
        raise ValueError("cannot sample from weights that do not sum to a positive number")
    i = bisect.bisect_right(cdf, u * cdf[-1])
    if i >= len(cdf):  # round-off at the top end: the last index of positive weight
        i = max(j for j, w in enumerate(weights) if w > 0.0)
    return i


def sample(probs: Sequence[float], rng: random.Random) -> int:
    """Plain sampling from ``probs``: the baseline speculative sampling must match."""
    return sample_index(probs, rng.random())


def margin_ratio(first_logit: float, second_logit: float, temperature: float = 1.0) -> float:
    """p2 / p1 after temperature, from the two largest logits: exp((l2 - l1) / T)."""
    if temperature <= 0.0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if second_logit > first_logit:
        raise ValueError("second_logit is larger than first_logit")
    return math.exp((second_logit - first_logit) / temperature)


def _check_rows(draft: Sequence[int], rows: int) -> None:
    if rows != len(draft) + 1:
        raise ValueError(f"{len(draft)} drafted tokens need {len(draft) + 1} target rows, got {rows}")


def accept_greedy(draft: Sequence[int], target_top1: Sequence[int]) -> Verdict:
    """Greedy verification: ``target_top1[i]`` is the target's argmax at draft position ``i``
    (``len(draft) + 1`` of them, the last one after the whole draft)."""
    _check_rows(draft, len(target_top1))
    for i, token in enumerate(draft):
        if token != target_top1[i]:
            return Verdict(i, (*draft[:i], target_top1[i]))
    return Verdict(len(draft), (*draft, target_top1[len(draft)]))


def accept_mars(draft: Sequence[int], tops: Sequence[TopTwo], theta: float = MARS_THETA) -> Verdict:
    """MARS verification: keep a draft that is the top-1, or the top-2 with p2 / p1 > ``theta``;
    the correction and the bonus are the top-1. Not exact (see the module's contract)."""
    _check_rows(draft, len(tops))
    if not 0.0 < theta <= 1.0:
        raise ValueError(f"theta must lie in (0, 1], got {theta}")
    for i, token in enumerate(draft):
        top = tops[i]
        if token != top.first and not (token == top.second and top.ratio > theta):
            return Verdict(i, (*draft[:i], top.first))
    return Verdict(len(draft), (*draft, tops[len(draft)].first))


def accept_sampling(
    draft: Sequence[int],
    target_probs: Sequence[Sequence[float]],
    draft_probs: Sequence[Sequence[float]] | None,
    rng: random.Random,
) -> Verdict:
    """Speculative rejection sampling. ``target_probs``: ``len(draft) + 1`` rows of the target's
    next-token distribution; ``draft_probs``: the ``len(draft)`` distributions the drafts were
    drawn from, or None for a deterministic drafter (a point mass at each draft)."""
    _check_rows(draft, len(target_probs))
    if draft_probs is not None and len(draft_probs) != len(draft):
        raise ValueError(f"{len(draft)} drafted tokens need {len(draft)} draft rows, "
                         f"got {len(draft_probs)}")
    for i, token in enumerate(draft):
        p = target_probs[i]
        q = draft_probs[i] if draft_probs is not None else None
        q_token = 1.0 if q is None else float(q[token])
        if not q_token > 0.0:
            raise ValueError(f"draft {i} (token {token}) has probability 0 under its own drafter")
        if rng.random() * q_token < p[token]:  # kept with probability min(1, p / q)
            continue
        if q is None:
            residual = list(p)
            residual[token] = 0.0
        else:
            residual = [max(0.0, a - b) for a, b in zip(p, q, strict=True)]
        return Verdict(i, (*draft[:i], sample(residual, rng)))
    return Verdict(len(draft), (*draft, sample(target_probs[len(draft)], rng)))


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one step with ``k`` drafts emits in expectation: (1 - a^(k+1)) / (1 - a)."""
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must lie in [0, 1], got {acceptance}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def reusable_lookahead(sent: Sequence[int], kept: Sequence[int],
                       ahead: Sequence[int]) -> tuple[int, ...] | None:
    """What of a lookahead the next step may use as its draft.

    ``sent``: the drafts a step verified; ``kept``: the tokens its verdict emitted (kept drafts
    and the rule's own token); ``ahead``: what the drafter drafted on after ``sent`` meanwhile.
    When ``kept`` is a prefix of ``sent + ahead``, the tokens of ``ahead`` after it (possibly
    none); None when ``kept`` departs from that sequence or reaches past its end."""
    speculated = [*sent, *ahead]
    if len(kept) > len(speculated) or list(kept) != speculated[:len(kept)]:
        return None
    return tuple(speculated[len(kept):])


def draft_wait_ms(k: int, acceptance: float, draft_ms: float, verify_ms: float, *,
                  overlap: bool) -> float:
    """Drafting time on the critical path of a step of ``k`` drafts, in expectation.

    Without overlap: ``k * draft_ms``. With overlap (steps of ``k`` drafts, each verified in
    ``verify_ms``, while a lookahead drafting at the same speed drafts the bonus guess and
    ``k`` more): after a hit (probability ``a^(k+1)``) the lookahead has drafted
    ``floor(verify_ms / draft_ms) - 1`` of the next draft (at most ``k``), and the rest is
    drafted then; after a miss all ``k`` are."""
    if k < 0 or min(draft_ms, verify_ms) < 0.0:
        raise ValueError(f"need k >= 0 and times >= 0, got k={k}, {draft_ms}, {verify_ms}")
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must lie in [0, 1], got {acceptance}")
    if not overlap or k == 0 or draft_ms == 0.0:
        return k * draft_ms
    if verify_ms >= (k + 1) * draft_ms:
        ready = k
    else:
        ready = max(0, math.floor(verify_ms / draft_ms) - 1)
    return (k - acceptance ** (k + 1) * ready) * draft_ms


def choose_k(
    acceptance: float,
    draft_ms: float,
    step_base_ms: float,
    step_per_position_ms: float,
    *,
    k_min: int = 0,
    k_max: int = MAX_DRAFT,
) -> int:
    """The draft length in [k_min, k_max] that maximizes E(k) / (draft_ms * k + t_step(k))
    with t_step(k) = step_base_ms + step_per_position_ms * (k + 1); ties go to the shorter
    draft. Above ``k_min``, a ``k`` with ``draft_ms * k > t_step(k)`` is never chosen."""
    if not 0 <= k_min <= k_max:
        raise ValueError(f"need 0 <= k_min <= k_max, got {k_min}, {k_max}")
    if min(draft_ms, step_base_ms, step_per_position_ms) < 0.0:
        raise ValueError("times must be >= 0")
    best_k, best_rate = k_min, -1.0
    for k in range(k_min, k_max + 1):
        step = step_base_ms + step_per_position_ms * (k + 1)
        if k > k_min and draft_ms * k > step:
            break
        cost = draft_ms * k + step
        rate = expected_tokens(acceptance, k) / max(cost, 1e-9)
        if rate > best_rate * (1.0 + 1e-9):
            best_k, best_rate = k, rate
    return best_k


class AdaptiveK:
    """Chooses each step's draft length from what the previous steps measured.

    ``observe`` takes one step: drafts proposed and kept, the drafter's time and the target's
    step time with the number of positions it ran. Estimates are exponentially decayed sums
    (``decay`` per step): acceptance = kept / examined drafts (a step examines the kept drafts
    and the first rejected one); the step time is fitted as ``base + per_position * n`` by
    least squares over the decayed (n, ms) pairs, with ``per_position_ms`` as the slope until
    steps of different lengths have been seen: every ``probe_every``-th step drafts one token
    more or fewer than the best guess (alternately), so the lengths vary and both terms stay
    measurable. ``k`` never goes below ``k_min`` (1 by default), so drafting goes on and
    acceptance stays measured. ``draft_ms`` is the drafting a step waited for: with a
    lookahead (see :func:`draft_wait_ms`) less than the drafter's own time.
    """

    def __init__(
        self,
        *,
        k_init: int = 4,
        k_min: int = 1,
        k_max: int = MAX_DRAFT,
        prior_acceptance: float = 0.7,
        per_position_ms: float = 0.0,
        decay: float = 0.9,
        probe_every: int = 8,
    ) -> None:
        if not 0 <= k_min <= k_init <= k_max:
            raise ValueError(f"need 0 <= k_min <= k_init <= k_max, got {k_min}, {k_init}, {k_max}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must lie in (0, 1), got {decay}")
        if not 0.0 <= prior_acceptance <= 1.0:
            raise ValueError(f"prior_acceptance must lie in [0, 1], got {prior_acceptance}")
        if probe_every < 2:
            raise ValueError(f"probe_every must be >= 2, got {probe_every}")
        self.k_min, self.k_max, self.decay, self.probe_every = k_min, k_max, decay, probe_every
        self.prior_per_position_ms = per_position_ms
        self._k = k_init
        # one pseudo-observation of the prior acceptance, so the first steps do not swing k
        self._kept, self._examined = prior_acceptance, 1.0
        self._draft_ms, self._drafted = 0.0, 0.0
        self._w = self._n = self._t = self._nn = self._nt = 0.0
        self.steps = 0

    @property
    def k(self) -> int:
        """The draft length for the next step."""
        return self._k

    @property
    def acceptance(self) -> float:
        return self._kept / self._examined

    @property
    def draft_ms(self) -> float:
        """The drafter's measured time per drafted token."""
        return self._draft_ms / self._drafted if self._drafted else 0.0

    def step_model(self) -> tuple[float, float]:
        """(base_ms, per_position_ms) of the fitted step time."""
        if self._w == 0.0:
            return 0.0, self.prior_per_position_ms
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var = self._nn / self._w - mean_n * mean_n
        slope = self.prior_per_position_ms
        if var > 0.05:
            slope = max(0.0, (self._nt / self._w - mean_n * mean_t) / var)
        return max(0.0, mean_t - slope * mean_n), slope

    def observe(self, *, drafted: int, accepted: int, draft_ms: float, step_ms: float,
                positions: int) -> int:
        """Record one step and return the next ``k``."""
        if not 0 <= accepted <= drafted or positions < 1:
            raise ValueError(f"bad step: drafted {drafted}, accepted {accepted}, "
                             f"positions {positions}")
        if draft_ms < 0.0 or step_ms < 0.0:
            raise ValueError("times must be >= 0")
        d = self.decay
        self._kept = self._kept * d + accepted
        self._examined = self._examined * d + min(accepted + 1, drafted)
        if drafted:
            self._draft_ms = self._draft_ms * d + draft_ms
            self._drafted = self._drafted * d + drafted
        n = float(positions)
        self._w = self._w * d + 1.0
        self._n = self._n * d + n
        self._t = self._t * d + step_ms
        self._nn = self._nn * d + n * n
        self._nt = self._nt * d + n * step_ms
        self.steps += 1
        base, slope = self.step_model()
        best = choose_k(min(1.0, self.acceptance), self.draft_ms, base, slope,
                        k_min=self.k_min, k_max=self.k_max)
        if self.steps % self.probe_every == 0:
            probe = best + (1 if (self.steps // self.probe_every) % 2 else -1)
            if not self.k_min <= probe <= self.k_max:
                probe = 2 * best - probe
            best = min(self.k_max, max(self.k_min, probe))
        self._k = best
        return self._k
