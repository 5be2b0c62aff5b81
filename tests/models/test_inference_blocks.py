"""models.blocks: stages of decoder layers, chained, compute the whole model's function."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.blocks import LocalTarget, StageCache, greedy, load_head, load_stage  # noqa: E402
from models.gguf_torch import load_gguf_model, loaded_parameters  # noqa: E402
from tests.models import tiny  # noqa: E402

PROMPT = [5, 17, 33, 99, 100, 7]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_local_target_greedy_matches_transformers_generate(tiny_ggufs: dict[str, Path]) -> None:
    target = LocalTarget.from_gguf(tiny_ggufs["f32"])
    model, _ = load_gguf_model(tiny_ggufs["f32"])
    ref = model.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False,
                         eos_token_id=None)[0, len(PROMPT):].tolist()
    assert greedy(target, PROMPT, 24) == ref


def test_two_stages_chained_equal_the_whole_model(tiny_ggufs: dict[str, Path]) -> None:
    path = tiny_ggufs["f32"]
    head, first, second = load_head(path), load_stage(path, 0, 1), load_stage(path, 1, 2)
    c1, c2 = StageCache(), StageCache()
    whole = LocalTarget.from_gguf(path)
    ids = PROMPT + [3, 4, 5]
    hidden = second.forward(first.forward(head.embed_tokens(ids[:6]), 0, c1), 0, c2)
    more = second.forward(first.forward(head.embed_tokens(ids[6:]), 6, c1), 6, c2)
    chained = head.logits(np.concatenate([hidden, more]))
    np.testing.assert_allclose(chained, whole.forward(ids, 0), atol=1e-5)


def test_rollback_recomputes_the_same_logits(tiny_ggufs: dict[str, Path]) -> None:
    target = LocalTarget.from_gguf(tiny_ggufs["f32"])
    first = target.forward(PROMPT + [1, 2, 3], 0)
    target.rollback(4)
    assert target.length == 4
    again = target.forward(PROMPT[4:] + [1, 2, 3], 4)
    np.testing.assert_allclose(again, first[4:], atol=1e-5)
    with pytest.raises(ValueError, match="crop"):
        target.rollback(99)


def test_stage_holds_only_its_layers(tiny_ggufs: dict[str, Path]) -> None:
    part, _ = load_gguf_model(tiny_ggufs["f32"], (1, 2), head=False)
    held = loaded_parameters(part)
    assert held and all(k.startswith("model.layers.1.") for k in held)
    one, both = load_stage(tiny_ggufs["f32"], 1, 2), load_stage(tiny_ggufs["f32"], 0, 2)
    assert both.param_bytes == 2 * one.param_bytes
    head, _ = load_gguf_model(tiny_ggufs["f32"], (0, 0), head=True)
    assert set(loaded_parameters(head)) == {"model.embed_tokens.weight", "model.norm.weight",
                                            "lm_head.weight"}
    with pytest.raises(ValueError, match="outside the model"):
        load_gguf_model(tiny_ggufs["f32"], (1, tiny.LAYERS + 1), head=False)


def test_stage_refuses_bad_shapes_and_positions(tiny_ggufs: dict[str, Path]) -> None:
    stage = load_stage(tiny_ggufs["f32"], 0, 1)
    cache = StageCache()
    with pytest.raises(ValueError, match="shape"):
        stage.forward(np.zeros((2, tiny.HIDDEN + 1), np.float32), 0, cache)
    with pytest.raises(ValueError, match="positions start"):
        stage.forward(np.zeros((2, tiny.HIDDEN), np.float32), 3, cache)
    stage.forward(np.zeros((2, tiny.HIDDEN), np.float32), 0, cache)
    assert cache.length == 2 and cache.nbytes == 2 * stage.bytes_per_position
