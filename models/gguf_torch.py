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

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
#: Arrays longer than this are skipped (tokenizer vocab and merges), not decoded.
MAX_DECODED_ARRAY = 4096


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (rows, cols): GGUF stores dims reversed
    ggml_type: int
    data: np.ndarray  # raw (quantized) bytes, a view of the memory-mapped file


def _read_value(buf: memoryview, pos: int, vtype: int) -> tuple[Any, int]:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8", "replace"), pos + 8 + n
    if vtype == _ARRAY:
        itype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if itype in _SCALARS and count > MAX_DECODED_ARRAY:  # skip without decoding
            return None, pos + count * struct.calcsize(_SCALARS[itype])
        items = []
        for _ in range(count):
            item, pos = _read_value(buf, pos, itype)
            items.append(item)
        return (items if count <= MAX_DECODED_ARRAY else None), pos
    raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    """(metadata, tensors) of a GGUF v2/v3 file; tensors are zero-copy views of a memmap.

    A small reader of our own: ``gguf.GGUFReader`` decodes every vocabulary string into numpy
    views and takes ~4-9 s on SmolLM2's 49k-token vocab; this one skips long arrays (~0.1 s).
    """
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    raw = np.memmap(str(path), dtype=np.uint8, mode="r")
    buf = memoryview(raw)  # type: ignore[arg-type]
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (bad magic)")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    pos = 24
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key, pos = _read_value(buf, pos, _STRING)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        value, pos = _read_value(buf, pos + 4, vtype)
        if value is not None:
            meta[key] = value
    infos = []
    for _ in range(n_tensors):
        name, pos = _read_value(buf, pos, _STRING)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, tuple(int(d) for d in reversed(dims)), ggml_type, offset))
    align = int(meta.get("general.alignment", 32))
    data_start = (pos + align - 1) // align * align
    tensors = {}
    for name, shape, ggml_type, offset in infos:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        nbytes = int(np.prod(shape)) // block * type_size
        start = data_start + offset
        tensors[name] = GGUFTensor(name, shape, ggml_type, raw[start:start + nbytes])
    return meta, tensors


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation. w: (n_head * head_dim, C)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def llama_config(path: str | Path, meta: dict[str, Any], tensors: dict[str, GGUFTensor]) -> Any:
    """The transformers ``LlamaConfig`` a GGUF's metadata describes; ValueError for other archs."""
    from transformers import LlamaConfig

    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported by the torch "
                         "loader (only 'llama'); use the llama.cpp backend or an HF directory")
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
