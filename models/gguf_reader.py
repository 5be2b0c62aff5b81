"""Read a GGUF file's metadata and tensor table without torch: numpy and ``gguf`` only.

``read_gguf`` gives (metadata, tensors), the tensors zero-copy views of a memory map; models/
gguf_torch.py builds a transformers model from them. A daemon that only needs a number from
the metadata (how many blocks the model has) reads it here, instead of importing torch and
transformers for it, which costs seconds of every daemon start. ``tokenizer_hash`` names a
model's tokenizer, so that a drafter is paired only with a target that shares it.
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
#: a GGUF tensor has at most this many dimensions (ggml's GGML_MAX_DIMS)
MAX_DIMS = 4


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


class HeaderIncomplete(ValueError):
    """The bytes given end inside the GGUF header: more of the file's start is needed."""


def parse_header(buf: memoryview, what: object = "GGUF") -> tuple[
        dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
    """(metadata, [(name, shape, ggml type, offset from the data start)], data start) of the
    GGUF whose first bytes are ``buf``; HeaderIncomplete when ``buf`` ends inside the header."""
    try:
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{what}: not a GGUF file (bad magic)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise ValueError(f"{what}: GGUF version {version} is not supported")
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
            if n_dims > MAX_DIMS:
                raise ValueError(f"{what}: tensor {name!r} has {n_dims} dimensions")
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            infos.append((name, tuple(int(d) for d in reversed(dims)), ggml_type, offset))
    except struct.error:
        raise HeaderIncomplete(f"{what}: {len(buf)} bytes end inside the GGUF header") from None
    if pos > len(buf):  # a string ran past the end: positions are right, its bytes are not
        raise HeaderIncomplete(f"{what}: {len(buf)} bytes end inside the GGUF header")
    align = int(meta.get("general.alignment", 32))
    return meta, infos, (pos + align - 1) // align * align


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return int(np.prod(shape)) // block * type_size


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
    """(metadata, tensors) of a GGUF v2/v3 file; tensors are zero-copy views of a memmap.

    A small reader of our own: ``gguf.GGUFReader`` decodes every vocabulary string into numpy
    views and takes ~4-9 s on SmolLM2's 49k-token vocab; this one skips long arrays (~0.1 s).
    Only the tensors used are ever read: a file whose other bytes are holes (a block server's
    partial copy, node/inference/weights.py) loads its stage all the same.
    """
    raw = np.memmap(str(path), dtype=np.uint8, mode="r")
    meta, infos, data_start = parse_header(memoryview(raw), path)  # type: ignore[arg-type]
    tensors = {}
    for name, shape, ggml_type, offset in infos:
        start = data_start + offset
        nbytes = tensor_nbytes(shape, ggml_type)
        tensors[name] = GGUFTensor(name, shape, ggml_type, raw[start:start + nbytes])
    return meta, tensors


def tensor_spans(buf: memoryview, wanted: Any) -> tuple[dict[str, Any], int, list[tuple[int, int]]]:
    """(metadata, header length, [(file offset, length)] of every tensor ``wanted(name)``
    accepts), from the file's first bytes ``buf``; HeaderIncomplete if they are too few."""
    meta, infos, data_start = parse_header(buf)
    spans = [(data_start + offset, tensor_nbytes(shape, ggml_type))
             for name, shape, ggml_type, offset in infos if wanted(name)]
    return meta, data_start, spans


def block_count(path: str | Path) -> int:
    """The number of decoder blocks of a GGUF, of any architecture: ``{arch}.block_count``."""
    meta, _ = read_gguf(path)
    arch = meta.get("general.architecture")
    count = meta.get(f"{arch}.block_count")
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"{path}: GGUF of architecture {arch!r} gives no block count")
    return count


#: what a tokenizer is made of: its vocabulary, merges and kinds of token, and its special ids
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                  "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")


def _value_end(buf: memoryview, pos: int, vtype: int) -> int:
    """Where the value of type ``vtype`` starting at ``pos`` ends, without decoding it."""
    if vtype in _SCALARS:
        return pos + struct.calcsize(_SCALARS[vtype])
    if vtype == _STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype == _ARRAY:
        itype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if itype in _SCALARS:
            return pos + count * struct.calcsize(_SCALARS[itype])
        for _ in range(count):
            pos = _value_end(buf, pos, itype)
        return pos
    raise ValueError(f"unknown GGUF value type {vtype}")


def tokenizer_hash(path: str | Path) -> str:
    """BLAKE2b-256 (hex) of the GGUF's tokenizer: the serialized bytes of each of
    :data:`TOKENIZER_KEYS` it has (type tag and value, as the file stores them). Two models
    with the same hash turn text into the same ids and back: a drafter and its target."""
    import hashlib

    raw = np.memmap(str(path), dtype=np.uint8, mode="r")
    buf = memoryview(raw)  # type: ignore[arg-type]
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (bad magic)")
    _, _, n_kv = struct.unpack_from("<IQQ", buf, 4)
    found: dict[str, bytes] = {}
    pos = 24
    for _ in range(n_kv):
        key, pos = _read_value(buf, pos, _STRING)
        (vtype,) = struct.unpack_from("<I", buf, pos)
        end = _value_end(buf, pos + 4, vtype)
        if key in TOKENIZER_KEYS:
            found[key] = bytes(buf[pos:end])
        pos = end
    if "tokenizer.ggml.tokens" not in found:
        raise ValueError(f"{path}: GGUF has no tokenizer (tokenizer.ggml.tokens)")
    h = hashlib.blake2b(digest_size=32)
    for key in TOKENIZER_KEYS:
        blob = found.get(key, b"")
        h.update(struct.pack("<Q", len(key)) + key.encode() + struct.pack("<Q", len(blob)) + blob)
    return h.hexdigest()
