"""Read a GGUF file's metadata and tensor table without torch: numpy and ``gguf`` only.

``read_gguf`` gives (metadata, tensors), the tensors zero-copy views of a memory map; models/
gguf_torch.py builds a transformers model from them. A daemon that only needs a number from
the metadata (how many blocks the model has) reads it here, instead of importing torch and
transformers for it, which costs seconds of every daemon start.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


def require_llama(path: str | Path, meta: dict[str, Any]) -> None:
    """ValueError unless the GGUF's metadata says it is a llama-architecture model."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported by the torch "
                         "loader (only 'llama'); use the llama.cpp backend or an HF directory")


def llama_block_count(path: str | Path) -> int:
    """The number of decoder blocks of a llama-architecture GGUF (from its metadata)."""
    meta, _ = read_gguf(path)
    require_llama(path, meta)
    return int(meta["llama.block_count"])
