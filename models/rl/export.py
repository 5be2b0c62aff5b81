"""Export a LoRA adapter as a llama.cpp LoRA GGUF, content-addressed and tagged with its version.

The file follows llama.cpp's ``convert_lora_to_gguf.py``: ``general.architecture = llama``,
``general.type = adapter``, ``adapter.type = lora``, ``adapter.lora.alpha``, and per adapted
weight two F32 tensors ``blk.N.<tensor>.weight.lora_a`` (r, in) and ``...lora_b`` (out, r)
(numpy order; GGUF stores the dims reversed, which is what llama.cpp checks against the base
tensor). llama.cpp applies ``scale * alpha / r * B A x``, the same update as models.rl.lora.
The converter permutes the rows of the Q and K projections (interleaved rotary halves), so the
``lora_b`` of ``attn_q`` / ``attn_k`` is permuted the same way here.

``symphony.policy_version`` carries the version; the file is named by the SHA-256 of its bytes,
so a worker that fetched it by hash knows it holds exactly what the learner exported.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

#: the metadata key that carries the policy version of an exported adapter
VERSION_KEY = "symphony.policy_version"

#: transformers layer path (after "model.layers.N.") -> GGUF base tensor (after "blk.N.")
_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q.weight",
    "self_attn.k_proj": "attn_k.weight",
    "self_attn.v_proj": "attn_v.weight",
    "self_attn.o_proj": "attn_output.weight",
    "mlp.gate_proj": "ffn_gate.weight",
    "mlp.up_proj": "ffn_up.weight",
    "mlp.down_proj": "ffn_down.weight",
}


@dataclass(frozen=True, slots=True)
class AdapterFile:
    path: Path
    sha256: str  # hex of the file's bytes; also its file name
    version: int
    size: int  # bytes


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp converter's Q/K row permutation. w: (n_head * head_dim, r)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(state: dict[str, torch.Tensor], n_head: int, n_kv_head: int) -> dict[str, np.ndarray]:
    """The adapter's tensors under their llama.cpp names, in a fixed (sorted) order."""
    out: dict[str, np.ndarray] = {}
    for key in sorted(state):
        layer, _, part = key.rpartition(".")
        prefix, _, target = layer.partition(".layers.")
        block, _, path = target.partition(".")
        if prefix != "model" or part not in ("lora_a", "lora_b") or path not in _GGUF_NAMES:
            raise ValueError(f"adapter tensor {key!r} has no llama.cpp name")
        arr = state[key].detach().to("cpu", torch.float32).numpy().copy()
        if part == "lora_b" and path == "self_attn.q_proj":
            arr = _permute(arr, n_head)
        elif part == "lora_b" and path == "self_attn.k_proj":
            arr = _permute(arr, n_kv_head)
        out[f"blk.{int(block)}.{_GGUF_NAMES[path]}.{part}"] = np.ascontiguousarray(arr)
    return out


def export_adapter(state: dict[str, torch.Tensor], directory: Path, *, version: int, alpha: float,
                   n_head: int, n_kv_head: int) -> AdapterFile:
    """Write the adapter to ``directory/<sha256>.gguf`` (atomically) and describe it."""
    import gguf

    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".export-{os.getpid()}-{version}.tmp"
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    writer.add_uint32(VERSION_KEY, version)
    for name, arr in gguf_tensors(state, n_head, n_kv_head).items():
        writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    digest = hashlib.sha256()
    with open(tmp, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    sha = digest.hexdigest()
    path = directory / f"{sha}.gguf"
    os.replace(tmp, path)
    return AdapterFile(path=path, sha256=sha, version=version, size=path.stat().st_size)


def verify_adapter(path: Path, sha256: str) -> None:
    """Raise ValueError unless the file's SHA-256 is ``sha256`` (what a worker checks)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise ValueError(f"adapter {path} has SHA-256 {digest[:16]}..., expected {sha256[:16]}...")
