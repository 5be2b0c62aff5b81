from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: why a test that builds the tiny model is skipped: torch and gguf come with the models extra
NEEDS_TORCH = "needs torch and gguf (pip install -e .[models])"


def _tiny():  # type: ignore[no-untyped-def]
    """tests/models/tiny.py, or a skip naming what is missing: it builds models with torch and
    writes them with gguf."""
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    pytest.importorskip("gguf", reason=NEEDS_TORCH)
    from tests.models import tiny

    return tiny


@pytest.fixture(scope="session")
def tiny_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"f32": model seed 0, "q8" / "q4": same model in Q8_0 / Q4_0, "other": a different
    model (seed 1)}."""
    tiny = _tiny()
    d = tmp_path_factory.mktemp("tiny")
    base = tiny.tiny_model(seed=0)
    return {
        "f32": tiny.write_gguf(base, d / "tiny-f32.gguf"),
        "q8": tiny.write_gguf(base, d / "tiny-q8.gguf", quant="Q8_0"),
        "q4": tiny.write_gguf(base, d / "tiny-q4.gguf", quant="Q4_0"),
        "other": tiny.write_gguf(tiny.tiny_model(seed=1), d / "tiny-other.gguf"),
    }


@pytest.fixture(scope="session")
def tiny_hf(tiny_ggufs: dict[str, Path]):  # type: ignore[no-untyped-def]
    """Transformers backend on the tiny f32 GGUF."""
    from models.loader import load_backend

    return load_backend(str(tiny_ggufs["f32"]), backend="transformers")
