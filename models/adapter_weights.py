"""A llama.cpp LoRA GGUF read back into torch, and merged into the fp32 check model's blocks.

An agent on a LoRA adapter generates through llama.cpp with the adapter applied (models/
solver.py), so the layer states it commits are the adapted model's. A verifier re-running
those layers (models/checks.py, models.layer_states) must compute the same function: it
merges the adapter into the weights of the blocks it re-runs, ``W + scale * B A`` with
llama.cpp's scale (``alpha / r``, or 1 when the file gives no alpha), and restores the exact
base weights afterwards, so the cached check model serves the next check unchanged.

The file is what the executor named (its content hash is bound to its commitment and the
relay checks the bytes against it), so it is the executor's responsibility: anything that
is not a LoRA adapter fitting the model (names, dtypes, shapes, rank up to ``MAX_RANK``)
raises ``ValueError``, and no input makes it raise anything else.

The tensor names and the Q/K row permutation follow llama.cpp's converter (models/rl/
export.py writes them that way): ``blk.N.<tensor>.weight.lora_a`` (r, in) and ``.lora_b``
(out, r) in numpy order; for a ``llama`` adapter the ``lora_b`` rows of ``attn_q`` /
``attn_k`` are in llama.cpp's interleaved rotary order, undone here as transformers undoes
it for the base weights.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: the highest LoRA rank a check takes (a larger one is refused, not merged)
MAX_RANK = 256
#: GGUF base tensor (after "blk.N.") -> the transformers module path in a decoder block
MODULES = {
    "attn_q.weight": "self_attn.q_proj",
    "attn_k.weight": "self_attn.k_proj",
    "attn_v.weight": "self_attn.v_proj",
    "attn_output.weight": "self_attn.o_proj",
    "ffn_gate.weight": "mlp.gate_proj",
    "ffn_up.weight": "mlp.up_proj",
    "ffn_down.weight": "mlp.down_proj",
}
_NAME = re.compile(r"blk\.(\d{1,4})\.([a-z_]+\.weight)\.(lora_a|lora_b)")
_F32, _F16 = 0, 1


@dataclass(frozen=True, slots=True)
class LoraPair:
    a: np.ndarray  # (r, in) float32
    b: np.ndarray  # (out, r) float32, rows in transformers' order


@dataclass(frozen=True, slots=True)
class LoraWeights:
    """An adapter's pairs by (block, transformers module path), and llama.cpp's scale."""

    pairs: dict[tuple[int, str], LoraPair]
    scale: float


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row permutation (models/rl/export.py ``_permute``)."""
    if n_head < 1 or w.shape[0] % (2 * n_head):
        raise ValueError(f"{w.shape[0]} rows do not split into {n_head} rotary heads")
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def _array(tensor: Any) -> np.ndarray:
    count = int(np.prod(tensor.shape))
    if tensor.ggml_type == _F32:
        raw = np.frombuffer(tensor.data, dtype="<f4", count=count)
    elif tensor.ggml_type == _F16:
        raw = np.frombuffer(tensor.data, dtype="<f2", count=count)
    else:
        raise ValueError(f"{tensor.name}: tensor type {tensor.ggml_type} (F32 or F16 wanted)")
    out = raw.astype(np.float32).reshape(tensor.shape)
    if not np.isfinite(out).all():
        raise ValueError(f"{tensor.name}: not finite")
    return out


def read_lora(path: str | Path, n_head: int, n_kv_head: int) -> LoraWeights:
    """The adapter at ``path`` (ValueError when it is not a LoRA GGUF as described above)."""
    from models.gguf_reader import read_gguf

    try:
        meta, tensors = read_gguf(path)
        if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
            raise ValueError("not a LoRA adapter GGUF")
        alpha = float(meta.get("adapter.lora.alpha") or 0.0)
        parts: dict[tuple[int, str], dict[str, np.ndarray]] = {}
        for name, tensor in tensors.items():
            m = _NAME.fullmatch(name)
            if m is None or m.group(2) not in MODULES or len(tensor.shape) != 2:
                raise ValueError(f"tensor {name!r} is not a LoRA pair's half")
            key = (int(m.group(1)), MODULES[m.group(2)])
            parts.setdefault(key, {})[m.group(3)] = _array(tensor)
        llama = meta.get("general.architecture") == "llama"
    except ValueError:
        raise
    except Exception as exc:  # a truncated or garbled file: whatever the reader tripped on
        raise ValueError(f"unreadable adapter: {type(exc).__name__}: {exc}") from None
    pairs = {key: _pair(key, halves, llama, n_head, n_kv_head) for key, halves in parts.items()}
    ranks = {p.a.shape[0] for p in pairs.values()}
    if not pairs or len(ranks) != 1:
        raise ValueError("an adapter has pairs of one rank")
    rank = ranks.pop()
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha {alpha} is not a LoRA scale")
    return LoraWeights(pairs, alpha / rank if alpha else 1.0)


def _pair(key: tuple[int, str], halves: dict[str, np.ndarray], llama: bool, n_head: int,
          n_kv_head: int) -> LoraPair:
    if set(halves) != {"lora_a", "lora_b"}:
        raise ValueError(f"block {key[0]} {key[1]}: lora_a and lora_b go together")
    a, b = halves["lora_a"], halves["lora_b"]
    if not 1 <= a.shape[0] <= MAX_RANK or b.shape[1] != a.shape[0]:
        raise ValueError(f"block {key[0]} {key[1]}: ranks {a.shape[0]} and {b.shape[1]} "
                         f"(equal, at most {MAX_RANK})")
    if llama and key[1] == "self_attn.q_proj":
        b = _unpermute(b, n_head)
    elif llama and key[1] == "self_attn.k_proj":
        b = _unpermute(b, n_kv_head)
    return LoraPair(a, np.ascontiguousarray(b))


def _module(block: Any, path: str) -> Any:
    owner, attr = path.split(".")
    return getattr(getattr(block, owner), attr)


@contextmanager
def merged(backend: Any, lora: LoraWeights | None, blocks: Iterable[int]) -> Iterator[None]:
    """Within the block, the check model of ``backend`` (models.layer_states) computes the
    adapted model in ``blocks`` (0-based decoder blocks); its base weights come back exactly
    after it. ``lora`` None: nothing changes. ValueError (nothing merged) when the adapter
    does not fit the model."""
    if lora is None:
        yield
        return
    import torch

    from models.hf_layers import decoder_of

    base = decoder_of(backend.model)
    n = len(base.layers)
    if any(not 0 <= i < n for i, _ in lora.pairs):
        raise ValueError(f"the adapter names blocks beyond the model's {n}")
    wanted = [(i, path, pair) for (i, path), pair in sorted(lora.pairs.items())
              if i in set(blocks)]
    saved: list[tuple[Any, Any]] = []
    with torch.no_grad():
        deltas = []
        for i, path, pair in wanted:
            weight = _module(base.layers[i], path).weight  # (out, in)
            if (pair.b.shape[0], pair.a.shape[1]) != tuple(weight.shape):
                raise ValueError(f"block {i} {path}: adapter {pair.b.shape[0]}x"
                                 f"{pair.a.shape[1]} for a {tuple(weight.shape)} weight")
            delta = torch.from_numpy(pair.b) @ torch.from_numpy(pair.a) * lora.scale
            deltas.append((weight, delta.to(weight.device, weight.dtype)))
        try:
            for weight, delta in deltas:
                saved.append((weight, weight.detach().clone()))
                weight.add_(delta)
            yield
        finally:
            for weight, original in saved:
                weight.copy_(original)
