"""models.stage_kv on the tiny model: a stage's steps recomputed one position at a time on
its committed keys and values agree with what it computed step by step (outputs and K/V
rows), whichever rows are recomputed together; each dishonest kind is off at its steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")

import torch  # noqa: E402

from models.blocks import StageCache, load_head, load_stage  # noqa: E402
from models.dishonest import KINDS, DishonestStage  # noqa: E402
from models.stage_kv import load_kv, recheck, row_error, step_kv  # noqa: E402
from protocol.inference.stage_checks import disagrees  # noqa: E402

PROMPT = [5, 17, 33, 99, 100, 7]
STEPS = 12


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _steps(stage: object, x: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray, StageCache]:
    """The prompt's prefill then one position a step: ((start, n) per step, outputs as sent
    (fp16), the cache)."""
    cache, spans, out = StageCache(), [(0, len(PROMPT))], []
    spans += [(p, 1) for p in range(len(PROMPT), len(x))]
    for start, n in spans:
        out.append(_fp16(stage.forward(x[start:start + n], start, cache)))  # type: ignore[attr-defined]
    return spans, np.concatenate(out), cache


@pytest.fixture(scope="module")
def inputs(tiny_ggufs: dict[str, Path]) -> np.ndarray:
    ids = PROMPT + [(7 * i + 3) % 100 for i in range(STEPS)]
    return _fp16(load_head(tiny_ggufs["f32"]).embed_tokens(ids))


def test_recheck_on_committed_kv_agrees_with_the_steps(tiny_ggufs: dict[str, Path],
                                                       inputs: np.ndarray) -> None:
    stage = load_stage(tiny_ggufs["f32"], 0, 2)
    _, sent, cache = _steps(stage, inputs)
    kv = step_kv(cache, range(0, 2), 0, len(inputs))
    assert kv.shape == (len(inputs), 2, 2, 32)  # 2 kv heads of 16
    values = cache.held()[1][1][0].numpy()  # layer 1's V: (kv_heads, T, head_dim)
    np.testing.assert_array_equal(kv[:, 1, 1].reshape(len(inputs), 2, 16),
                                  values.transpose(1, 0, 2))
    every = np.arange(len(inputs))
    y, new = recheck(stage, inputs, every, kv)
    assert row_error(sent, y) < 5e-4  # the outputs' fp16 rounding only
    assert row_error(kv, new) < 1e-5
    some = np.array([2, 7, 11, len(inputs) - 1])  # any rows, together, on K/V up to the last
    y2, new2 = recheck(stage, inputs[some], some, kv[:some.max() + 1])
    np.testing.assert_allclose(y2, y[some], atol=1e-5)
    np.testing.assert_allclose(new2, new[some], atol=1e-5)
    with pytest.raises(ValueError, match="K/V committed for"):
        recheck(stage, inputs[some], some, kv[:some.max()])


@pytest.mark.parametrize("kind", KINDS)
def test_every_dishonest_kind_is_off_at_its_steps(tiny_ggufs: dict[str, Path],
                                                  inputs: np.ndarray, kind: str) -> None:
    honest = load_stage(tiny_ggufs["f32"], 0, 2)
    liar = DishonestStage(honest, kind, scale=0.05)
    spans, sent, cache = _steps(liar, inputs)
    kv = step_kv(cache, range(0, 2), 0, len(inputs))
    if kind == "skipped_layer":  # it has no K/V of the layer it skips: zeros are its answer
        assert not kv[:, 1].any()
    y, new = recheck(honest, inputs, np.arange(len(inputs)), kv)
    off = [disagrees(max(row_error(sent[a:a + n], y[a:a + n]),
                         row_error(kv[a:a + n], new[a:a + n]))) for a, n in spans]
    # replay's first step is honest (nothing to replay yet); every other step is off
    assert off == [kind != "replay"] + [True] * (len(spans) - 1), (kind, off)


def test_committed_kv_loaded_into_a_checkers_cache_and_rechecked_on_a_sub_range(
        tiny_ggufs: dict[str, Path], inputs: np.ndarray) -> None:
    """What a checker server does: the committed K/V appended to a fresh cache a frame at a
    time (models.stage_kv.load_kv) read back bit for bit; a recheck of layer 1 alone (a
    session on a sub-range) on layer 1's K/V gives the full recheck's outputs."""
    stage = load_stage(tiny_ggufs["f32"], 0, 2)
    _, _, cache = _steps(stage, inputs)
    kv = step_kv(cache, range(0, 2), 0, len(inputs))
    fresh = StageCache()
    load_kv(stage, fresh, range(0, 2), 0, kv[:5])
    load_kv(stage, fresh, range(0, 2), 5, kv[5:])
    np.testing.assert_array_equal(step_kv(fresh, range(0, 2), 0, len(inputs), 32), kv)
    load_kv(stage, fresh, range(0, 2), 3, kv[3:4])  # below the length: cut back first
    assert fresh.length == 4
    with pytest.raises(ValueError, match="non-finite"):
        load_kv(stage, fresh, range(0, 2), 4, np.full_like(kv[:1], np.nan))
    with pytest.raises(ValueError, match="the cache holds"):
        load_kv(stage, fresh, range(0, 2), 9, kv[9:10])
    some = np.array([1, 8, len(inputs) - 1])
    y, _ = recheck(stage, inputs[some], some, kv)
    layer0 = stage.forward(inputs, 0, StageCache(), (0, 1))
    y1, new1 = recheck(stage, layer0[some], some, kv[:, 1:2], (1, 2))
    np.testing.assert_allclose(y1, y, atol=1e-5)
    np.testing.assert_allclose(new1, kv[some][:, 1:2], atol=1e-5)
