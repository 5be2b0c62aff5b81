"""node/bench/gpu/shaped_model.py: a GGUF with a real file's header and seeded weights loads as
the real one does, with the same layout and valid values of each tensor type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf", reason="needs gguf (pip install -e .[models])")

from gguf import GGUFReader  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from node.bench.gpu import shaped_model as sm  # noqa: E402
from tests.models.conftest import tiny_ggufs  # noqa: E402, F401  (the fixture)


def _shaped(src: Path, tmp: Path, seed: int, name: str) -> Path:
    sm.save_header(src, tmp / "h.bin", tmp / "layout.json")
    return sm.synthesize(tmp / "h.bin", tmp / "layout.json", tmp / name, seed=seed)


def test_same_layout_as_the_real_file_and_valid_values(tiny_ggufs: dict[str, Path],  # noqa: F811
                                                       tmp_path: Path) -> None:
    src = tiny_ggufs["f32"]
    out = _shaped(src, tmp_path, 0, "shaped.gguf")
    assert out.stat().st_size == src.stat().st_size
    real, shaped = GGUFReader(str(src)), GGUFReader(str(out))
    assert [(t.name, t.tensor_type, list(t.shape)) for t in real.tensors] == \
        [(t.name, t.tensor_type, list(t.shape)) for t in shaped.tensors]
    assert all((np.asarray(t.data) == 1.0).all() for t in shaped.tensors)  # all F32 here
    from models.blocks import LocalTarget, greedy

    assert len(greedy(LocalTarget.from_gguf(out), [5, 17, 33], 4)) == 4


def test_quantized_blocks_decode_to_their_ranges(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    q41 = np.frombuffer(sm._fill("Q4_1", 20 * 8, rng), np.uint8).reshape(8, 20)
    values = dequantize(q41, sm_type("Q4_1"))
    lo, hi = sm.Q4_1_MIN, sm.Q4_1_MIN + 15 * sm.Q4_1_SCALE
    assert values.min() >= lo - 1e-3 and values.max() <= hi + 1e-3 and values.std() > 0
    q8 = np.frombuffer(sm._fill("Q8_0", 34 * 4, rng), np.uint8).reshape(4, 34)
    assert np.abs(dequantize(q8, sm_type("Q8_0"))).max() <= 127 * sm.Q8_0_SCALE + 1e-3


def sm_type(name: str):  # type: ignore[no-untyped-def]
    from gguf.constants import GGMLQuantizationType

    return GGMLQuantizationType[name]


def test_seeded_and_refuses_what_it_cannot_fill(tiny_ggufs: dict[str, Path],  # noqa: F811
                                                tmp_path: Path) -> None:
    rng = np.random.default_rng
    assert sm._fill("Q4_1", 200, rng(3)) == sm._fill("Q4_1", 200, rng(3))
    assert sm._fill("Q4_1", 200, rng(3)) != sm._fill("Q4_1", 200, rng(4))
    with pytest.raises(ValueError, match="not whole Q8_0 blocks"):
        sm._fill("Q8_0", 35, rng(0))
    with pytest.raises(ValueError, match=r"tensor types \['Q4_0'\] cannot be synthesized"):
        sm.save_header(tiny_ggufs["q4"], tmp_path / "h", tmp_path / "l")
