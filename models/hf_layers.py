"""Run a range of a transformers causal LM's own decoder layers, the way its model's forward
does: the same layer modules, rotary embeddings and attention masks, one range at a time.

A model's forward runs every layer from the token embeddings; a stage of a layer-sharded chain
(models.blocks) and the layer-state verifier (models.layer_states) run a range of them on
hidden states they are given, at positions that need not start at 0. What the forward computes
around its layers, and they must repeat, is the same for every architecture transformers 5
builds with full and sliding-window attention (Llama, Qwen, Mistral, Phi-3, Gemma 2/3, ...):

* one rotary embedding per attention kind when the model's rotary module takes a
  ``layer_type`` (Gemma 3: a local base frequency for sliding layers, a global one for full
  ones), else one for every layer;
* one mask per attention kind, from transformers' own mask functions
  (``causal_mask_function``, ``sliding_window_causal_mask_function(config.sliding_window)``)
  over the cached positions plus the new ones.

Everything else (norms, scaled embeddings, Q/K norms, soft-capping) happens inside the layer
and head modules transformers built, so nothing here is architecture-specific.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

FULL, SLIDING = "full_attention", "sliding_attention"


def decoder_of(model: Any) -> Any:
    """The decoder stack of a causal LM (``model.model``): layers, rotary, final norm."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def layer_kind(config: Any, index: int) -> str:
    """The attention kind of decoder layer ``index`` (0-based)."""
    kinds = getattr(config, "layer_types", None)
    return str(kinds[index]) if kinds else FULL


def attention_mask(config: Any, kind: str, start: int, n: int,
                   like: torch.Tensor | None = None) -> torch.Tensor:
    """Additive float mask (1, 1, n, start + n) of queries at positions start..start+n-1 over
    keys at 0..start+n-1, for layers of ``kind``; additive, as both the eager and the sdpa
    attention accept it. With ``like`` it has that tensor's dtype and device (sdpa wants the
    mask in the queries' dtype: fp16/bf16 stages on a GPU), else fp32 on the CPU."""
    from transformers.masking_utils import (
        causal_mask_function,
        sdpa_mask,
        sliding_window_causal_mask_function,
    )

    fn: Callable[..., Any] = causal_mask_function
    if kind == SLIDING and getattr(config, "sliding_window", None):
        fn = sliding_window_causal_mask_function(int(config.sliding_window))
    allowed = sdpa_mask(batch_size=1, q_length=n, kv_length=start + n, q_offset=start,
                        mask_function=fn, allow_is_causal_skip=False)
    if allowed is None:  # None means "use is_causal instead", never so with the skip refused
        raise RuntimeError("transformers' sdpa_mask gave no mask")
    dtype = like.dtype if like is not None else torch.float32
    device = like.device if like is not None else None
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
        ~allowed.to(device), torch.finfo(dtype).min)


def rotary_by_kind(rotary: Any, config: Any, kinds: set[str], x: torch.Tensor,
                   positions: torch.Tensor) -> dict[str, Any]:
    """kind -> the (cos, sin) the model's forward gives the layers of that kind."""
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        return {kind: rotary(x, positions, layer_type=kind) for kind in kinds}
    rope = rotary(x, position_ids=positions)
    return {kind: rope for kind in kinds}


def run_layers(rotary: Any, config: Any, layers: Sequence[tuple[int, Any]], x: torch.Tensor,
               start: int, cache: Any = None) -> list[torch.Tensor]:
    """Run ``layers`` ((index, module) pairs, in order) on x (1, n, C) at positions
    start..start+n-1; with ``cache`` (a transformers-style ``update(k, v, layer_idx)``) their
    keys and values are appended to it and attention sees the cached positions too.
    Returns each layer's output (1, n, C)."""
    n = int(x.shape[1])
    positions = torch.arange(start, start + n, device=x.device)[None]  # (1, n)
    kinds = {layer_kind(config, i) for i, _ in layers}
    masks = {kind: attention_mask(config, kind, start, n, like=x) for kind in kinds}
    outs = []
    with torch.no_grad():
        rope = rotary_by_kind(rotary, config, kinds, x, positions)
        for i, layer in layers:
            kind = layer_kind(config, i)
            x = layer(x, attention_mask=masks[kind], position_ids=positions,
                      past_key_values=cache, use_cache=cache is not None,
                      position_embeddings=rope[kind])
            outs.append(x)
    return outs
