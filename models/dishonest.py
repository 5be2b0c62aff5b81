"""Dishonest stages, for tests and benches: a stage of a chain that returns well-formed hidden
states computed more cheaply, or not at all, than the blocks it serves.

:class:`DishonestStage` wraps an honest models.blocks.BlockStage and answers ``forward`` with
one of :data:`KINDS`:

* ``bf16``: the stage's weights rounded to bfloat16 and every layer's input and output rounded
  to bfloat16 (a stage that holds its blocks and activations in bf16 to save memory; the
  arithmetic inside a layer stays fp32: torch's bf16 matmuls on a CPU without bf16 units are
  several times slower than fp32, so this is the cheap imitation of the same rounding);
* ``coarser_quant``: its layers' weight matrices requantized to Q4_0 through the gguf package
  (a coarser quantization than the Q4_1 the model is served as; every dimension the models
  here use is a multiple of Q4_0's block of 32);
* ``skipped_layer``: the middle layer of the stage is skipped (its keys and values are not
  cached either: the stage does strictly less work);
* ``noise``: the honest output plus Gaussian noise of ``scale`` times each row's RMS, seeded
  by the position, so it is reproducible;
* ``replay``: the honest computation fills the cache, but the answer is the previous step's
  output (its last row for every position asked): the first step, with nothing to replay, is
  honest.

Nothing in the daemon turns one on unless its config names a kind (``[inference] dishonest``,
for tests and benches only).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from models.blocks import BlockStage, StageCache

KINDS = ("bf16", "coarser_quant", "skipped_layer", "noise", "replay")
#: the noise kind's default scale: its noise's RMS over each row's RMS
DEFAULT_NOISE_SCALE = 0.01


def _q4_0(param: torch.Tensor) -> torch.Tensor:
    from gguf.quants import GGMLQuantizationType, dequantize, quantize

    if param.ndim != 2 or param.shape[-1] % 32:
        return param
    w = param.detach().float().numpy()
    q = dequantize(quantize(w, GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)
    return torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32))


def _bf16(param: torch.Tensor) -> torch.Tensor:
    return param.to(torch.bfloat16).float()


def _rewritten(layers: list[Any], kind: str) -> list[Any]:
    """Copies of ``layers`` whose weights went through Q4_0 (``coarser_quant``) or bfloat16
    (``bf16``) and back."""
    change = _q4_0 if kind == "coarser_quant" else _bf16
    out = []
    for layer in layers:
        clone = copy.deepcopy(layer)
        with torch.no_grad():
            for param in clone.parameters():
                param.copy_(change(param))
        out.append(clone)
    return out


class DishonestStage:
    """``stage``'s interface (forward, hidden_size, start, end, layers, config), dishonestly."""

    def __init__(self, stage: BlockStage, kind: str, scale: float = DEFAULT_NOISE_SCALE,
                 seed: int = 0) -> None:
        if kind not in KINDS:
            raise ValueError(f"dishonest kind {kind!r}: one of {', '.join(KINDS)}")
        self.honest, self.kind, self.scale, self.seed = stage, kind, scale, seed
        self.config, self.start, self.end = stage.config, stage.start, stage.end
        self.hidden_size, self.layers = stage.hidden_size, stage.layers
        self.rotary, self.device, self.dtype = stage.rotary, stage.device, stage.dtype
        self.bytes_per_position = stage.bytes_per_position
        cheap = kind in ("coarser_quant", "bf16")
        self._rewritten = _rewritten(stage.layers, kind) if cheap else None
        self._last: np.ndarray | None = None

    @property
    def param_bytes(self) -> int:
        return self.honest.param_bytes

    def forward(self, hidden: np.ndarray, start_pos: int, cache: StageCache,
                blocks: tuple[int, int] | None = None) -> np.ndarray:
        if self.kind in ("bf16", "coarser_quant", "skipped_layer"):
            return self._cheaper(hidden, start_pos, cache, blocks)
        out = self.honest.forward(hidden, start_pos, cache, blocks)
        if self.kind == "noise":
            rng = np.random.default_rng([self.seed, start_pos])
            rms = np.sqrt(np.mean(out.astype(np.float64) ** 2, axis=1, keepdims=True))
            return (out + rng.standard_normal(out.shape) * self.scale * rms).astype(np.float32)
        last, self._last = self._last, out
        return out if last is None else np.repeat(last[-1:], len(out), axis=0)

    def _cheaper(self, hidden: np.ndarray, start_pos: int, cache: StageCache,
                 blocks: tuple[int, int] | None) -> np.ndarray:
        from models.hf_layers import run_layers

        a, b = blocks or (self.start, self.end)
        if start_pos != cache.length:
            raise ValueError(f"positions start at {start_pos}, the cache holds {cache.length}")
        held = self._rewritten if self._rewritten is not None else self.layers
        layers = [(i, held[i - self.start]) for i in range(a, b)]
        if self.kind == "skipped_layer" and len(layers) > 1:
            del layers[len(layers) // 2]
        x = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))[None]  # (1, n, C)
        rotary = self.honest.rotary
        if self.kind != "bf16":
            return run_layers(rotary, self.config, layers, x, start_pos, cache)[-1][0].numpy()
        for layer in layers:  # one at a time, each one's input and output in bf16
            x = run_layers(rotary, self.config, [layer], _bf16(x), start_pos, cache)[-1]
        return _bf16(x)[0].numpy()
