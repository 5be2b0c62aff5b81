"""Stage checks per position, on a stage's committed keys and values.

A stage's output at a step depends on every earlier position only through its attention
cache: each layer's keys and values (K/V) of the positions before. A stage that commits, with
each step's frames, to the K/V rows the step appended (:func:`step_kv`) lets a checker
recompute any one step alone: the step's input rows at their own positions, every layer
attending to the committed K/V (:func:`recheck`), instead of a prefill of every position
before it. What a check then compares, per selected step, is both what the stage sent on
(its output rows) and what it kept for later steps (its K/V rows): a stage that computes
its blocks otherwise at a step is off in one or the other, whatever it committed before.
Selected steps of one stage are independent of each other, so one forward over all their
rows checks them all.

* :func:`step_kv` reads positions [start, start + n) out of a models.blocks.StageCache as an
  array (n, layers, 2, kv_heads * head_dim), fp32 (a layer the stage never cached, as a
  stage that skips it, gives zeros: what it has to show for it); its bytes, little-endian,
  are protocol.inference.recheck's K/V layout, what a stage commits to.
* :func:`load_kv` appends such rows (a stage's committed ones) to a cache: a checker's.
* :func:`recheck` recomputes rows at arbitrary positions on committed K/V: their outputs and
  their K/V rows, in one forward through the stage's own layers (models.hf_layers'
  rotary embeddings, a mask of each row over the committed positions up to its own).
* :func:`row_error` is the check's measure: the worst row's relative L2 error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def kv_width(config: Any) -> int:
    """Values in one key (or value) row of one layer: kv_heads * head_dim."""
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads)
    return int(config.num_key_value_heads) * int(head_dim)


def step_kv(cache: Any, layers: range, start: int, n: int, width: int | None = None,
            ) -> np.ndarray:
    """The K/V rows of positions [start, start + n) of ``layers`` (global layer indices)
    held in ``cache``: (n, len(layers), 2, kv_width) fp32; zeros for a layer never cached
    (``width``: kv_width, read off the cache when not given)."""
    held = cache.held()
    if width is None:
        width = next(int(k.shape[1] * k.shape[3]) for k, _ in held.values())
    out = np.zeros((n, len(layers), 2, width), dtype=np.float32)
    for j, index in enumerate(layers):
        if index not in held:
            continue
        for h, t in enumerate(held[index]):  # (1, kv_heads, T, head_dim)
            if t.device.type == "cpu" and t.dtype == torch.float32:  # a view: sliced in numpy,
                rows = t.detach()[0].numpy()[:, start:start + n]  # cheaper than torch's ops
            else:  # a device's half precision: only these rows come over
                rows = t[0, :, start:start + n].float().cpu().numpy()
            out[:, j, h] = rows.transpose(1, 0, 2).reshape(n, width)  # (kv_heads, n, head_dim)
    return out


def load_kv(stage: Any, cache: Any, layers: range, start: int, kv: np.ndarray) -> None:
    """Append ``kv`` (n, len(layers), 2, kv_width) as positions start.. of ``layers`` to
    ``cache`` (cut to ``start`` first), on ``stage``'s device and dtype; ValueError for
    values that are not finite."""
    if not np.isfinite(kv).all():
        raise ValueError("committed K/V: non-finite values")
    cache.crop(min(start, cache.length))
    if cache.length != start:
        raise ValueError(f"committed K/V from {start}, the cache holds {cache.length}")
    heads = int(stage.config.num_key_value_heads)
    for j, index in enumerate(layers):
        k, v = (torch.from_numpy(np.ascontiguousarray(kv[:, j, h])).reshape(len(kv), heads, -1)
                .permute(1, 0, 2)[None].to(stage.device, stage.dtype) for h in (0, 1))
        cache.update(k, v, index)


class _Committed:
    """The cache the layers see in a recheck: the committed K/V, whatever rows they add (those
    are kept in ``new`` for the comparison)."""

    def __init__(self, kv: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.kv = kv
        self.new: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.new[layer_idx] = (key, value)
        return self.kv[layer_idx]


def _mask(config: Any, kind: str, positions: np.ndarray, total: int,
          dtype: torch.dtype) -> torch.Tensor:
    """Additive (1, 1, rows, total): each row sees the committed positions up to its own
    (within the sliding window for sliding layers)."""
    from models.hf_layers import SLIDING

    keys, rows = np.arange(total)[None, :], positions[:, None]
    allowed = keys <= rows
    window = getattr(config, "sliding_window", None)
    if kind == SLIDING and window:
        allowed &= rows - keys < int(window)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask[torch.from_numpy(~allowed)] = torch.finfo(dtype).min
    return mask[None, None]


def recheck(stage: Any, rows: np.ndarray, positions: np.ndarray, kv: np.ndarray,
            blocks: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``stage``'s layers (a models.blocks.BlockStage; ``blocks`` [a, b) of them, all when
    None) over input ``rows`` (k, C) at ``positions`` (k,), attending to the committed ``kv``
    (T, layers, 2, kv_width) of positions 0..T-1 (T past every position): (outputs (k, C),
    their K/V rows (k, layers, 2, kv_width)), fp32 (computed on the stage's device and dtype)."""
    from models.hf_layers import layer_kind, rotary_by_kind

    config, total = stage.config, int(kv.shape[0])
    if int(positions.max()) >= total:
        raise ValueError(f"positions up to {int(positions.max())}, K/V committed for {total}")
    a, b = blocks or (stage.start, stage.end)
    indices = range(a, b)
    device, dtype = getattr(stage, "device", torch.device("cpu")), getattr(
        stage, "dtype", torch.float32)
    heads = int(config.num_key_value_heads)
    committed = {}
    for j, index in enumerate(indices):
        k, v = (torch.from_numpy(np.ascontiguousarray(kv[:, j, h])).reshape(total, heads, -1)
                .permute(1, 0, 2)[None].to(device, dtype) for h in (0, 1))
        committed[index] = (k, v)
    cache = _Committed(committed)
    x = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32))[None]  # (1, k, C)
    x = x.to(device, dtype)
    pos = torch.from_numpy(positions.astype(np.int64))[None].to(device)  # (1, k)
    kinds = {layer_kind(config, i) for i in indices}
    masks = {kind: _mask(config, kind, positions, total, dtype).to(device) for kind in kinds}
    with torch.no_grad():
        rope = rotary_by_kind(stage.rotary, config, kinds, x, pos)
        for index in indices:
            kind = layer_kind(config, index)
            x = stage.layers[index - stage.start](
                x, attention_mask=masks[kind], position_ids=pos, past_key_values=cache,
                use_cache=True, position_embeddings=rope[kind])
    new = np.stack([np.stack([t[0].permute(1, 0, 2).reshape(len(positions), -1).float()
                              .cpu().numpy() for t in cache.new[i]], axis=1)
                    for i in indices], axis=1)
    return x[0].float().cpu().numpy(), new


def row_error(got: np.ndarray, ref: np.ndarray) -> float:
    """The worst row's relative L2 error of ``got`` against ``ref`` (rows: the last axis)."""
    diff = np.linalg.norm((got - ref).reshape(-1, ref.shape[-1]), axis=1)
    norm = np.linalg.norm(ref.reshape(-1, ref.shape[-1]), axis=1)
    return float(np.max(diff / np.maximum(norm, 1e-12)))
