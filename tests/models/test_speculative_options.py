"""models.speculative's options for the chains' OpenAI-style sampling: ``top_p`` cuts the
target's distribution to its nucleus exactly as models.backend.choose_token does (and the
speculative loop keeps that distribution), and ``on_tokens`` sees every step's tokens and can
end the generation."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

from models.backend import SamplingParams, choose_token, log_softmax  # noqa: E402
from models.drafters import softmax  # noqa: E402
from models.speculative import SpeculativeConfig, speculative_generate, target_probs  # noqa: E402
from protocol.inference.speculative import Rule  # noqa: E402
from tests.models.markov import (  # noqa: E402
    CHI2_CRIT_11,
    PROMPT,
    MarkovTarget,
    NoisyDrafter,
    V,
)


def test_the_nucleus_is_the_backends() -> None:
    rows = np.random.default_rng(4).normal(0.0, 2.0, size=(20, V)).astype(np.float32)
    config = SpeculativeConfig(rule=Rule.SAMPLING, temperature=0.7, top_p=0.8)
    probs = target_probs(rows, config)
    params = SamplingParams(temperature=0.7, top_p=0.8)
    for row, p in zip(rows, probs, strict=True):
        full = softmax(row, 0.7)
        kept, cut = p > 0, p == 0
        # the fewest most likely tokens whose mass reaches top_p, renormalized
        assert full[kept].sum() >= 0.8 and full[kept].sum() - full[kept].min() < 0.8
        assert not cut.any() or full[kept].min() >= full[cut].max()
        assert np.allclose(p[kept], full[kept] / full[kept].sum())
        drawn = {choose_token(log_softmax(row), params, np.random.default_rng(s))
                 for s in range(300)}
        assert drawn <= set(np.flatnonzero(kept))  # the backend never draws outside it
    assert np.array_equal(target_probs(rows, SpeculativeConfig(temperature=0.7)),
                          softmax(rows, 0.7))
    with pytest.raises(ValueError, match="top_p"):
        SpeculativeConfig(top_p=0.0)


def test_sampling_with_top_p_through_the_loop_keeps_the_nucleus_distribution() -> None:
    """The second token over many seeds, speculative vs the exact nucleus distribution; a loop
    that ignored top_p would draw tokens outside the nucleus and fail."""
    n = 2000
    config = SpeculativeConfig(rule=Rule.SAMPLING, k=3, top_p=0.7)
    base = MarkovTarget()
    first = target_probs(base.table[PROMPT[-2], PROMPT[-1]], config)
    second = np.zeros(V)
    for a in np.flatnonzero(first):
        second += first[a] * target_probs(base.table[PROMPT[-1], a], config)
    counts: Counter[int] = Counter()
    for seed in range(n):
        target = MarkovTarget()
        drafter = NoisyDrafter(target, 1.5, temperature=1.3)
        counts[speculative_generate(target, PROMPT, 2, drafter, config, seed=seed).tokens[1]] += 1
    assert all(second[t] > 0 for t in counts)
    chi2 = sum((counts[t] - n * second[t]) ** 2 / (n * second[t]) for t in range(V)
               if second[t] > 0)
    assert chi2 < CHI2_CRIT_11, f"chi2 {chi2:.1f} over {n} seeds"


def test_on_tokens_sees_every_step_and_can_stop_the_generation() -> None:
    seen: list[list[int]] = []

    def watch(tokens: list[int]) -> bool:
        seen.append(list(tokens))
        return len(tokens) >= 5

    target = MarkovTarget()
    gen = speculative_generate(target, PROMPT, 40, NoisyDrafter(target, 0.5),
                               SpeculativeConfig(k=3), on_tokens=watch)  # type: ignore[arg-type]
    assert 5 <= len(gen.tokens) <= 5 + 3  # the step that reached 5 tokens was the last
    assert seen[-1] == gen.tokens and all(len(a) < len(b) for a, b in zip(seen, seen[1:], strict=False))
    assert seen[0] == gen.tokens[:1]  # the first token, from the prompt's pass
