"""The speculative decoding loop over a target: draft locally, verify in one pass, keep a prefix.

``speculative_generate(target, prompt, max_tokens, drafter, config, seed)`` drives any target
with ``forward(token_ids, start) -> logits`` and ``rollback(length)`` (the whole model in this
process, or a chain of servers each holding a range of its blocks). Each step feeds the pending
token and ``k`` drafted tokens in one call, so a chain pays one round trip for up to ``k + 1``
tokens; the acceptance rule (protocol.inference.speculative) keeps a prefix of the draft and
adds one token, and the target's caches are rolled back to the kept prefix.

With no drafter, or ``k = 0``, the very same loop is plain decoding (one position a step): the
baseline the speed-ups are measured against. Greedy verification gives exactly the tokens of
plain greedy decoding; rejection sampling gives the distribution of plain sampling; MARS
gives neither exactly (see its rule).

Draft lengths: a fixed ``config.k``, or (``k=None``) protocol.inference.speculative's
AdaptiveK fed with the measured acceptance, drafting time and step times.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from models.blocks import Target
from models.drafters import Draft, Drafter, softmax
from protocol.inference.speculative import (
    MARS_THETA,
    MAX_DRAFT,
    AdaptiveK,
    Rule,
    TopTwo,
    Verdict,
    accept_greedy,
    accept_mars,
    accept_sampling,
    margin_ratio,
    sample,
)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    rule: Rule = Rule.GREEDY  # how drafts are verified (MARS: not exact, off by default)
    temperature: float = 1.0  # sampling: the target's temperature; MARS: for the p2/p1 ratio
    top_p: float = 1.0  # sampling: the target's nucleus mass (1 = off), as models.backend's
    k: int | None = None  # drafted tokens a step; None = adaptive (AdaptiveK)
    k_max: int = MAX_DRAFT  # the longest draft the adaptive choice may make
    k_init: int = 4  # the adaptive choice's first draft length
    theta: float = MARS_THETA  # MARS margin: keep a top-2 draft when p2 / p1 > theta

    def __post_init__(self) -> None:
        if self.temperature <= 0.0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.k is not None and not 0 <= self.k <= self.k_max:
            raise ValueError(f"k must lie in [0, k_max={self.k_max}], got {self.k}")
        if not 1 <= self.k_init <= self.k_max:
            raise ValueError(f"k_init must lie in [1, k_max={self.k_max}], got {self.k_init}")


@dataclass
class Generation:
    """What a generation produced and what it measured."""

    tokens: list[int]
    steps: int = 0  # target passes after the prefill
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    target_s: float = 0.0  # the prefill and every step
    wall_s: float = 0.0
    ks: list[int] = field(default_factory=list)  # draft length of each step

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else 0.0


class _ProbRows(Sequence[Sequence[float]]):
    """Rows of a (n, V) probability array, each turned into a list only when read."""

    def __init__(self, probs: np.ndarray) -> None:
        self._probs = probs
        self._rows: dict[int, list[float]] = {}

    def __len__(self) -> int:
        return int(self._probs.shape[0])

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i not in self._rows:
            self._rows[i] = self._probs[i].tolist()
        return self._rows[i]


def _top_two(rows: np.ndarray, temperature: float) -> list[TopTwo]:
    """Each row's two largest logits as TopTwo (p2 / p1 after temperature)."""
    out = []
    for row in rows:
        two = np.argpartition(row, -2)[-2:]
        first, second = (int(two[1]), int(two[0])) if row[two[1]] >= row[two[0]] else (
            int(two[0]), int(two[1]))
        out.append(TopTwo(first, second, margin_ratio(float(row[first]), float(row[second]),
                                                        temperature)))
    return out


def target_probs(rows: np.ndarray, config: SpeculativeConfig) -> np.ndarray:
    """The distributions plain sampling draws from: softmax(rows / T), each row cut to its
    nucleus when ``top_p`` < 1 (the fewest most likely tokens whose mass reaches top_p, as
    models.backend.choose_token keeps them) and renormalized. (n, V) float64."""
    probs = softmax(rows, config.temperature)
    if config.top_p >= 1.0:
        return probs
    for row in np.atleast_2d(probs):
        order = np.argsort(-row, kind="stable")
        keep = int(np.searchsorted(np.cumsum(row[order]), config.top_p) + 1)
        row[order[keep:]] = 0.0
        row /= row.sum()
    return probs


def first_token(row: np.ndarray, config: SpeculativeConfig, rng: random.Random) -> int:
    """The token plain decoding picks from one row of logits under ``config``'s rule."""
    if config.rule is Rule.SAMPLING:
        return sample(target_probs(row, config).tolist(), rng)
    return int(np.argmax(row))


def verify(draft: Draft, rows: np.ndarray, config: SpeculativeConfig,
           rng: random.Random) -> Verdict:
    """Apply ``config.rule`` to ``draft`` against the target's (len(draft)+1, V) logits."""
    if config.rule is Rule.GREEDY:
        return accept_greedy(draft.tokens, [int(t) for t in rows.argmax(axis=1)])
    if config.rule is Rule.MARS:
        return accept_mars(draft.tokens, _top_two(rows, config.temperature), config.theta)
    probs = _ProbRows(target_probs(rows, config))
    q = None if draft.probs is None else _ProbRows(draft.probs)
    return accept_sampling(draft.tokens, probs, q, rng)


def _emit(out: list[int], new: Sequence[int], max_tokens: int, stop: frozenset[int]) -> bool:
    """Append ``new`` to ``out`` up to the budget or a stop token; True when generation ends."""
    for token in new:
        out.append(int(token))
        if token in stop or len(out) >= max_tokens:
            return True
    return False


def speculative_generate(
    target: Target,
    prompt: Sequence[int],
    max_tokens: int,
    drafter: Drafter | None = None,
    config: SpeculativeConfig = SpeculativeConfig(),
    *,
    seed: int = 0,
    stop: Sequence[int] = (),
    on_tokens: Callable[[Sequence[int]], bool] | None = None,
) -> Generation:
    """Generate up to ``max_tokens`` after ``prompt`` (the target's caches must be empty).

    ``on_tokens`` is called with every token generated so far each time a step adds some (a
    stream's deltas); when it returns True the generation ends there (a stop string, a
    client gone)."""
    if not prompt:
        raise ValueError("an empty prompt")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rng = random.Random(seed)
    stops = frozenset(int(t) for t in stop)
    adaptive = AdaptiveK(k_init=config.k_init, k_max=config.k_max) if config.k is None else None
    started = time.perf_counter()
    logits = target.forward(prompt, 0)
    gen = Generation(tokens=[])
    gen.target_s = time.perf_counter() - started
    pending = first_token(logits[-1], config, rng)
    pos = len(prompt)
    done = _emit(gen.tokens, [pending], max_tokens, stops)
    done = bool(on_tokens is not None and on_tokens(gen.tokens)) or done
    while not done:
        k = 0 if drafter is None else (adaptive.k if adaptive is not None else config.k or 0)
        k = min(k, max_tokens - len(gen.tokens) - 1)  # never draft past the budget
        t0 = time.perf_counter()
        draft = drafter.draft([*prompt, *gen.tokens], k, rng) if drafter and k > 0 else Draft(())
        t1 = time.perf_counter()
        rows = target.forward([pending, *draft.tokens], pos)  # (1 + len(draft), V)
        t2 = time.perf_counter()
        verdict = verify(draft, rows, config, rng)
        if verdict.accepted < len(draft.tokens):
            target.rollback(pos + 1 + verdict.accepted)
        pos += 1 + verdict.accepted
        pending = verdict.tokens[-1]
        gen.steps += 1
        gen.drafted += len(draft.tokens)
        gen.accepted += verdict.accepted
        gen.draft_s += t1 - t0
        gen.target_s += t2 - t1
        gen.ks.append(len(draft.tokens))
        if adaptive is not None and draft.tokens:
            adaptive.observe(drafted=len(draft.tokens), accepted=verdict.accepted,
                             draft_ms=(t1 - t0) * 1000, step_ms=(t2 - t1) * 1000,
                             positions=1 + len(draft.tokens))
        done = _emit(gen.tokens, verdict.tokens, max_tokens, stops)
        done = bool(on_tokens is not None and on_tokens(gen.tokens)) or done
    gen.wall_s = time.perf_counter() - started
    return gen
