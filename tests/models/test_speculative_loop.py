"""models.speculative and models.drafters on in-test targets and drafters: greedy speculative
decoding gives exactly the greedy tokens, the target's caches follow every rollback, sampling
keeps plain sampling's distribution through the real loop, MARS keeps more drafts."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

from models.drafters import NgramDrafter, softmax  # noqa: E402
from models.speculative import SpeculativeConfig, speculative_generate  # noqa: E402
from protocol.inference.speculative import Rule  # noqa: E402
from tests.models.markov import CHI2_CRIT_11, PROMPT, MarkovTarget, NoisyDrafter, V


@pytest.mark.parametrize("k", [None, 1, 3, 6])
@pytest.mark.parametrize("noise", [0.3, 3.0])
def test_greedy_speculation_gives_the_greedy_tokens(k: int | None, noise: float) -> None:
    plain = speculative_generate(MarkovTarget(), PROMPT, 64)
    target = MarkovTarget()
    spec = speculative_generate(target, PROMPT, 64, NoisyDrafter(target, noise),
                                SpeculativeConfig(k=k))
    assert spec.tokens == plain.tokens
    assert len(spec.tokens) == 64 and plain.steps == 63
    assert spec.steps < plain.steps if noise < 1 else spec.steps <= plain.steps
    # the target's caches hold exactly the prompt and every generated token but the last
    assert target.cache == PROMPT + spec.tokens[:-1]
    assert max(target.calls[1:]) == 1 + max(spec.ks)


def test_stop_tokens_and_the_budget_end_generation() -> None:
    plain = speculative_generate(MarkovTarget(), PROMPT, 40)
    stop = plain.tokens[9]
    target = MarkovTarget()
    spec = speculative_generate(target, PROMPT, 40, NoisyDrafter(target, 0.3),
                                SpeculativeConfig(k=4), stop=[stop])
    assert spec.tokens == plain.tokens[: plain.tokens.index(stop) + 1]
    short = speculative_generate(MarkovTarget(), PROMPT, 3, NoisyDrafter(MarkovTarget(), 0.3),
                                 SpeculativeConfig(k=8))
    assert short.tokens == plain.tokens[:3] and max(short.ks) <= 2
    with pytest.raises(ValueError, match="empty prompt"):
        speculative_generate(MarkovTarget(), [], 3)


def test_ngram_drafter_proposes_what_followed_the_latest_match() -> None:
    d = NgramDrafter(max_n=3)
    rng = random.Random(0)
    assert d.draft([1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3], 2, rng).tokens == (8, 1)
    assert d.draft([4, 5, 6, 7, 1, 5, 6], 4, rng).tokens == (7, 1, 5, 6)
    assert d.draft([1, 2, 3, 4], 3, rng).tokens == ()  # the suffix never occurred before
    assert d.draft([1, 2, 1], 5, rng).tokens == (2, 1)  # bigram miss, unigram match
    assert d.draft([1, 2, 1], 0, rng).tokens == ()
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(max_n=1, min_n=2)


def test_greedy_speculation_with_the_ngram_drafter_on_a_repetitive_target() -> None:
    target = MarkovTarget(scale=6.0)  # peaky: greedy decoding soon cycles, n-grams guess it
    plain = speculative_generate(MarkovTarget(scale=6.0), PROMPT, 64)
    spec = speculative_generate(target, PROMPT, 64, NgramDrafter(), SpeculativeConfig(k=4))
    assert spec.tokens == plain.tokens
    assert spec.acceptance_rate > 0.5 and spec.steps < plain.steps / 2


def test_mars_keeps_more_drafts_than_greedy() -> None:
    def run(rule: Rule) -> tuple[int, float]:
        target = MarkovTarget(scale=0.5)  # flat distributions: close seconds are common
        gen = speculative_generate(target, PROMPT, 64, NoisyDrafter(target, 0.4),
                                   SpeculativeConfig(rule=rule, k=4, theta=0.8))
        return gen.steps, gen.acceptance_rate

    greedy_steps, greedy_rate = run(Rule.GREEDY)
    mars_steps, mars_rate = run(Rule.MARS)
    assert mars_rate > greedy_rate and mars_steps < greedy_steps


@pytest.mark.parametrize("deterministic", [False, True])
def test_sampling_through_the_loop_keeps_the_distribution(deterministic: bool) -> None:
    """The second generated token over many seeds, speculative vs the exact distribution."""
    n = 3000
    base = MarkovTarget()
    probs = softmax(base.table[PROMPT[-2], PROMPT[-1]], 1.0)
    second = np.zeros(V)  # exact P(second token) = sum_a p(a) p(. | last, a)
    for a in range(V):
        second += probs[a] * softmax(base.table[PROMPT[-1], a], 1.0)
    config = SpeculativeConfig(rule=Rule.SAMPLING, k=3)
    counts: Counter[int] = Counter()
    for seed in range(n):
        target = MarkovTarget()
        drafter = NoisyDrafter(target, 1.5, temperature=0.0 if deterministic else 1.3)
        counts[speculative_generate(target, PROMPT, 2, drafter, config, seed=seed).tokens[1]] += 1
    chi2 = sum((counts[t] - n * second[t]) ** 2 / (n * second[t]) for t in range(V))
    assert chi2 < CHI2_CRIT_11, f"chi2 {chi2:.1f} over {n} seeds"
