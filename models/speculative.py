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

Given a second drafter (``lookahead``), ``config.overlap`` (the default) and a deterministic
draft (greedy or MARS verification), it drafts on while the target verifies each draft, as if
all of it is kept (models.lookahead): when all of it is kept and the bonus token is its
guess, what it drafted opens the next draft.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from models.blocks import Target
from models.drafters import Draft, Drafter, softmax
from models.lookahead import Drafting
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
    overlap: bool = True  # draft on while the target verifies (not with sampled drafts)

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
    draft_s: float = 0.0  # drafting waited for (not what ran during verification)
    drafter_ms_per_token: float = 0.0  # the loop's drafter's time per token it drafted
    target_s: float = 0.0  # the prefill and every step
    prefill_s: float = 0.0
    examined: int = 0  # drafts checked: the kept ones and each step's first rejected one
    lookahead_hits: int = 0  # verdicts that left the lookahead's drafts holding
    lookahead_tokens: int = 0  # tokens the lookahead drafted (used or not)
    wall_s: float = 0.0
    ks: list[int] = field(default_factory=list)  # draft length of each step

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def position_acceptance(self) -> float:
        """Kept over examined drafts: the chance a draft is kept, given those before it were."""
        return self.accepted / self.examined if self.examined else 0.0

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
    lookahead: Drafter | None = None,
    lookahead_idle: bool = True,
    adaptive: AdaptiveK | None = None,
) -> Generation:
    """Generate up to ``max_tokens`` after ``prompt`` (the target's caches must be empty).

    ``on_tokens`` is called with every token generated so far each time a step adds some (a
    stream's deltas); when it returns True the generation ends there (a stop string, a
    client gone). ``lookahead``: a second drafter like ``drafter`` (its own state), for the
    overlap, at idle priority unless ``lookahead_idle`` is False (models.lookahead says when). ``adaptive``: the draft-length rule to go on with (it keeps learning; with
    ``config.k`` None), e.g. what an earlier generation over the same chain measured."""
    if not prompt:
        raise ValueError("an empty prompt")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rng = random.Random(seed)
    overlap = config.overlap and config.rule is not Rule.SAMPLING
    drafting = None if drafter is None else Drafting(
        drafter, rng, lookahead if overlap else None, idle=lookahead_idle)
    try:
        loop = _Loop(target, list(prompt), max_tokens, config, rng,
                     frozenset(int(t) for t in stop), on_tokens, drafting, adaptive)
        return loop.run()
    finally:
        if drafting is not None:
            drafting.close()


class _Loop:
    """One generation's decoding loop (see speculative_generate)."""

    def __init__(self, target: Target, prompt: list[int], max_tokens: int,
                 config: SpeculativeConfig, rng: random.Random, stops: frozenset[int],
                 on_tokens: Callable[[Sequence[int]], bool] | None,
                 drafting: Drafting | None, adaptive: AdaptiveK | None) -> None:
        self.target, self.prompt, self.max_tokens = target, prompt, max_tokens
        self.config, self.rng, self.stops, self.on_tokens = config, rng, stops, on_tokens
        self.drafting = drafting
        self.adaptive = None if config.k is not None else (
            adaptive or AdaptiveK(k_init=config.k_init, k_max=config.k_max))
        self.gen = Generation(tokens=[])

    def _emit(self, new: Sequence[int]) -> bool:
        done = _emit(self.gen.tokens, new, self.max_tokens, self.stops)
        return bool(self.on_tokens is not None and self.on_tokens(self.gen.tokens)) or done

    def run(self) -> Generation:
        gen, target, drafting = self.gen, self.target, self.drafting
        started = time.perf_counter()
        logits = target.forward(self.prompt, 0)
        gen.target_s = gen.prefill_s = time.perf_counter() - started
        pending = first_token(logits[-1], self.config, self.rng)
        pos = len(self.prompt)
        done = self._emit([pending])
        while not done:
            k = 0 if drafting is None else (
                self.adaptive.k if self.adaptive is not None else self.config.k or 0)
            k = min(k, self.max_tokens - len(gen.tokens) - 1)  # never draft past the budget
            context = [*self.prompt, *gen.tokens]
            t0 = time.perf_counter()
            draft = drafting.next(context, k) if drafting is not None else Draft(())
            t1 = time.perf_counter()
            if drafting is not None:
                drafting.look_ahead([*context, *draft.tokens], len(draft.tokens))
            rows = target.forward([pending, *draft.tokens], pos)  # (1 + len(draft), V)
            t2 = time.perf_counter()
            verdict = verify(draft, rows, self.config, self.rng)
            if verdict.accepted < len(draft.tokens):
                target.rollback(pos + 1 + verdict.accepted)
            if drafting is not None:
                drafting.settle(draft.tokens, verdict.tokens)
            self._record(draft, verdict, t1 - t0, t2 - t1)
            pos += 1 + verdict.accepted
            pending = verdict.tokens[-1]
            done = self._emit(verdict.tokens)
        gen.wall_s = time.perf_counter() - started
        if drafting is not None:
            gen.drafter_ms_per_token = drafting.ms_per_token
            gen.lookahead_hits, gen.lookahead_tokens = drafting.hits, drafting.ahead_tokens
        return gen

    def _record(self, draft: Draft, verdict: Verdict, waited_s: float, step_s: float) -> None:
        gen, n = self.gen, len(draft.tokens)
        gen.steps += 1
        gen.drafted += n
        gen.accepted += verdict.accepted
        gen.examined += min(verdict.accepted + 1, n)
        gen.draft_s += waited_s
        gen.target_s += step_s
        gen.ks.append(n)
        if self.adaptive is not None and n:
            self.adaptive.observe(drafted=n, accepted=verdict.accepted,
                                  draft_ms=waited_s * 1000, step_ms=step_s * 1000,
                                  positions=1 + n)
