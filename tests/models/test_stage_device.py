"""models.blocks on a device: which device a name means, the half precision a GPU stage runs
in, and masks in the queries' dtype (the GPU paths themselves run in `symphony bench gpu`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.blocks import LocalTarget, half_dtype, load_stage, resolve_device  # noqa: E402
from models.hf_layers import attention_mask  # noqa: E402

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize(("name", "error"), [
    ("gpu", "expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("cuda:x", "expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("cuda:-1", "expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("mps", "expected"),
    ("cuda:", "expected"),
])
def test_a_malformed_device_is_refused(name: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        resolve_device(name)


@pytest.mark.skipif(not NO_CUDA, reason="torch sees a CUDA device here")
def test_without_cuda_auto_is_the_cpu_and_cuda_is_refused() -> None:
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    for name in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ValueError, match="torch sees 0 CUDA device"):
            resolve_device(name)


@pytest.mark.parametrize(("model_type", "dtype"), [
    ("llama", torch.float16), ("qwen2", torch.float16),
    ("gemma3_text", torch.bfloat16), ("gemma", torch.bfloat16),
])
def test_gemma_runs_in_bf16_the_rest_in_fp16(model_type: str, dtype: torch.dtype) -> None:
    assert half_dtype(SimpleNamespace(model_type=model_type)) == dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_mask_takes_the_queries_dtype(dtype: torch.dtype) -> None:
    config = SimpleNamespace(sliding_window=None)
    like = torch.zeros(1, 3, 8, dtype=dtype)
    mask = attention_mask(config, "full_attention", 2, 3, like=like)
    assert mask.dtype == dtype and mask.shape == (1, 1, 3, 5)
    # query at position 2 sees keys 0..2, not 3..4
    assert (mask[0, 0, 0, :3] == 0).all() and (mask[0, 0, 0, 3:] == torch.finfo(dtype).min).all()
    assert attention_mask(config, "full_attention", 2, 3).dtype == torch.float32


def test_a_cpu_stage_stays_fp32_and_equals_the_whole_model(tiny_ggufs: dict[str, Path]) -> None:
    path = tiny_ggufs["f32"]
    stage = load_stage(path, 0, 2, device="auto" if NO_CUDA else "cpu")
    assert stage.dtype == torch.float32 and str(stage.device) == "cpu"
    whole = LocalTarget.from_gguf(path, device="cpu")
    hidden = whole.head.embed_tokens([5, 17, 33])
    from models.blocks import StageCache

    np.testing.assert_allclose(stage.forward(hidden, 0, StageCache()),
                               whole.stage.forward(hidden, 0, whole.cache), atol=1e-6)
