"""Load a llama-architecture GGUF file into a transformers ``LlamaForCausalLM`` (dequantized).

Why not ``from_pretrained(gguf_file=...)``: in transformers 5 that path requires ``accelerate``
and builds a tokenizer from the GGUF vocab (~8 s for SmolLM2); this module needs only ``gguf``
(numpy) and loads the 135M default model in about a second. Every weight is dequantized with
``gguf.quants.dequantize`` to float32, so the model computes exactly the function the
quantized weights define, in plain fp32 torch kernels (the reference path for fingerprints).

llama.cpp's converter permutes the rows of the Q and K projections (interleaved rotary halves);
:func:`_unpermute` undoes it, as transformers' own GGUF loader does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

# the reader needs no torch; it lives apart so that the daemon can read a model's metadata
# without importing torch and transformers
from models.gguf_reader import GGUFTensor, read_gguf, require_llama

#: GGUF tensor name (after "blk.{i}.") -> transformers parameter name (after "model.layers.{i}.")
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation. w: (n_head * head_dim, C)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def llama_config(path: str | Path, meta: dict[str, Any], tensors: dict[str, GGUFTensor]) -> Any:
    """The transformers ``LlamaConfig`` a GGUF's metadata describes; ValueError for other archs."""
    from transformers import LlamaConfig

    require_llama(path, meta)
    hidden = int(meta["llama.embedding_length"])
    n_head = int(meta["llama.attention.head_count"])
    n_kv = int(meta.get("llama.attention.head_count_kv", n_head))
    vocab = int(meta.get("llama.vocab_size", tensors["token_embd.weight"].shape[0]))
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_hidden_layers=int(meta["llama.block_count"]),
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        head_dim=int(meta.get("llama.rope.dimension_count", hidden // n_head)),
        max_position_embeddings=int(meta.get("llama.context_length", 2048)),
        rms_norm_eps=float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def _param_name(name: str) -> str | None:
    """The transformers parameter name of GGUF tensor ``name``; None for tensors not used."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    prefix, _, rest = name.partition(".")[2].partition(".")
    if not name.startswith("blk.") or rest not in _LAYER_TENSORS:
        return None  # e.g. rope_freqs: not used by this loader
    return f"model.layers.{prefix}.{_LAYER_TENSORS[rest]}"


def _state(tensors: dict[str, GGUFTensor], n_head: int, n_kv: int,
           wanted: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """Dequantized fp32 parameters, by transformers name, of the tensors ``wanted`` accepts."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        param = _param_name(name)
        if param is None or not wanted(param):
            continue
        w = dequantize(np.asarray(tensor.data), GGMLQuantizationType(tensor.ggml_type))
        w = np.asarray(w, dtype=np.float32).reshape(tensor.shape)  # (rows, cols)
        if name.endswith(".attn_q.weight"):
            w = _unpermute(w, n_head)
        elif name.endswith(".attn_k.weight"):
            w = _unpermute(w, n_kv)
        state[param] = torch.from_numpy(np.array(w, copy=True))
    return state


def load_gguf_part(path: str | Path, start: int, end: int,
                   head: bool) -> tuple[Any, dict[str, torch.Tensor]]:
    """(LlamaConfig, fp32 parameters) of decoder layers [start, end) only, plus the embedding,
    final norm and output head when ``head``: a stage of a layer-sharded chain dequantizes
    nothing else, so its memory grows with end - start. Names are transformers' own
    (``model.layers.{i}.…``, ``model.embed_tokens.weight``, ``model.norm.weight``,
    ``lm_head.weight``; a tied head comes back as the embedding only)."""
    meta, tensors = read_gguf(path)
    config = llama_config(path, meta, tensors)
    if not 0 <= start <= end <= config.num_hidden_layers:
        raise ValueError(f"{path}: layer range [{start}, {end}) is outside the model's "
                         f"{config.num_hidden_layers} layers")
    layers = tuple(f"model.layers.{i}." for i in range(start, end))

    def wanted(param: str) -> bool:
        return param.startswith(layers) if param.startswith("model.layers.") else head

    return config, _state(tensors, config.num_attention_heads, config.num_key_value_heads, wanted)


def load_gguf_llama(path: str | Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(LlamaForCausalLM in fp32 eval mode, GGUF metadata). Raises ValueError for other archs."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    meta, tensors = read_gguf(path)
    config = llama_config(path, meta, tensors)
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    state = _state(tensors, n_head, n_kv, lambda name: True)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    missing = set(model.state_dict()) - set(state) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if missing:
        raise ValueError(f"{path}: GGUF file lacks tensors for {sorted(missing)[:5]}")
    model.load_state_dict(state, strict=False, assign=True)
    model.model.rotary_emb = LlamaRotaryEmbedding(config)  # its buffers were left on "meta"
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()
    return model, meta
