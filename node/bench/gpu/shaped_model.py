"""A GGUF with the default model's header and seeded random weights, for timing on a machine
the real weights cannot be copied to.

The real SmolLM2-135M file (~90 MiB) does not fit in what a GPU check machine is sent, but
its header does (~1.7 MiB: every metadata key, the tokenizer, every tensor's name, shape,
type and offset). :func:`save_header` keeps that header and the tensors' layout;
:func:`synthesize` writes a file of exactly the real one's size and layout with each tensor
filled with valid values of its type: F32 tensors (the norms) are 1.0, Q4_1 blocks get scale
0.01, minimum -0.075 and random 4-bit codes, Q8_0 blocks scale 0.002 and random 8-bit codes.
llama.cpp and models.gguf_torch load it as they load the real file and run the same kernels
on the same shapes, so its tokens/s are the real model's for a fixed number of tokens; its
output is meaningless (nobody should read it as the model's).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: GGML type name -> (values per block, bytes per block)
BLOCKS = {"F32": (1, 4), "Q4_1": (32, 20), "Q8_0": (32, 34)}
Q4_1_SCALE, Q4_1_MIN, Q8_0_SCALE = 0.01, -0.075, 0.002


def save_header(src: str | Path, header: str | Path, layout: str | Path) -> None:
    """Keep ``src``'s bytes before its tensor data in ``header`` and its tensors' layout (name,
    type, offset, bytes) and total size as JSON in ``layout``."""
    from gguf import GGUFReader

    reader = GGUFReader(str(src))
    start = min(int(t.data_offset) for t in reader.tensors)
    tensors = [{"name": t.name, "type": t.tensor_type.name, "offset": int(t.data_offset),
                "bytes": int(t.n_bytes)} for t in reader.tensors]
    unknown = sorted({t["type"] for t in tensors} - set(BLOCKS))
    if unknown:
        raise ValueError(f"{src}: tensor types {unknown} cannot be synthesized")
    with open(src, "rb") as f:
        Path(header).write_bytes(f.read(start))
    Path(layout).write_text(json.dumps({"size": Path(src).stat().st_size, "tensors": tensors}))


def _fill(kind: str, n_bytes: int, rng: np.random.Generator) -> bytes:
    per_block, block_bytes = BLOCKS[kind]
    if n_bytes % block_bytes:
        raise ValueError(f"{n_bytes} bytes is not whole {kind} blocks")
    n = n_bytes // block_bytes
    if kind == "F32":
        return np.ones(n, "<f4").tobytes()
    blocks = np.empty((n, block_bytes), np.uint8)
    if kind == "Q4_1":  # d (f16), m (f16), 16 bytes of 4-bit codes
        blocks[:, 0:4] = np.array([Q4_1_SCALE, Q4_1_MIN], "<f2").view(np.uint8)
        blocks[:, 4:] = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    else:  # Q8_0: d (f16), 32 signed bytes
        blocks[:, 0:2] = np.array([Q8_0_SCALE], "<f2").view(np.uint8)
        blocks[:, 2:] = rng.integers(-127, 128, (n, per_block), dtype=np.int8).view(np.uint8)
    return blocks.tobytes()


def synthesize(header: str | Path, layout: str | Path, dst: str | Path, seed: int = 0) -> Path:
    """Write the GGUF ``header`` + ``layout`` describe to ``dst``, weights drawn with ``seed``."""
    spec = json.loads(Path(layout).read_text())
    rng = np.random.default_rng(seed)
    head = Path(header).read_bytes()
    with open(dst, "wb") as f:
        f.write(head)
        f.truncate(int(spec["size"]))
        for tensor in spec["tensors"]:
            f.seek(int(tensor["offset"]))
            f.write(_fill(str(tensor["type"]), int(tensor["bytes"]), rng))
    return Path(dst)
