"""The offline text embedder: it separates needs, its hash names its vector space, and the
model extracts once, atomically."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from protocol.agents.matching import (
    cosine,
    dequantize,
    match_score,
    quantize,
    vector_agrees,
)

pytest.importorskip("transformers")

from models.embedder import (  # noqa: E402
    HASH_FILE,
    Embedder,
    EmbedderConfig,
    default_embedder,
    files_hash,
    model_dir,
)

ARITHMETIC = "Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly."
OTHERS = [
    "Translates text between English, French and German.",
    "Searches a folder of documents and quotes the passages that answer a question.",
    "Writes, reviews and fixes Python code.",
]
#: how far the arithmetic agent must lead the best of the others for "exact arithmetic"
MIN_LEAD = 0.3


def test_files_hash_covers_every_file_and_its_name(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"2")
    first = files_hash(tmp_path)
    (tmp_path / HASH_FILE).write_text("ignored")
    assert files_hash(tmp_path) == first, "the stored hash is not part of what it hashes"
    (tmp_path / "sub" / "b").write_bytes(b"3")
    assert files_hash(tmp_path) != first
    (tmp_path / "sub" / "b").write_bytes(b"2")
    (tmp_path / "sub" / "b").rename(tmp_path / "sub" / "c")
    assert files_hash(tmp_path) != first


@pytest.mark.integration
def test_exact_arithmetic_matches_the_arithmetic_agent() -> None:
    e = default_embedder()
    need, arith, *others = e.embed(["exact arithmetic", ARITHMETIC, *OTHERS])
    assert e.dim == 384 and all(len(v) == 384 for v in (need, arith, *others))
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-5)
               for v in (need, arith, *others))
    scores = [match_score(need, (), dequantize(*quantize(v)), ()) for v in (arith, *others)]
    assert scores[0] >= max(scores[1:]) + MIN_LEAD, scores


@pytest.mark.integration
def test_a_card_vector_agrees_only_with_its_own_description() -> None:
    e = default_embedder()
    vectors = e.embed([ARITHMETIC, *OTHERS])
    again = e.embed([ARITHMETIC])[0]  # alone, not padded in a batch with longer texts
    card = dequantize(*quantize(vectors[0]))
    assert cosine(vectors[0], again) > 0.9999
    assert vector_agrees(card, again)
    assert not any(vector_agrees(dequantize(*quantize(v)), again) for v in vectors[1:])


@pytest.mark.integration
def test_the_model_extracts_once_and_its_hash_is_stable(tmp_path: Path) -> None:
    config = EmbedderConfig(cache_dir=tmp_path)
    folder = model_dir(config)
    stored = (folder / HASH_FILE).read_text()
    assert bytes.fromhex(stored) == files_hash(folder)
    mtime = (folder / HASH_FILE).stat().st_mtime_ns
    assert model_dir(config) == folder and (folder / HASH_FILE).stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [folder.name], "no temporary folder left"
    assert Embedder(config).hash == default_embedder().hash
