"""The one configuration object of models/: which model, which backend, how to run it."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The embedded default model (see models.registry): works with no config and no download.
DEFAULT_MODEL_NAME = "smollm2-135m-instruct-q4_1"
#: Backend kinds: llama.cpp serves (fast, quantized); transformers gives hidden states.
LLAMA_CPP = "llama.cpp"
TRANSFORMERS = "transformers"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    spec: str = DEFAULT_MODEL_NAME  # registry name, path to a .gguf file, or an HF directory
    backend: str = LLAMA_CPP  # "llama.cpp" (default for serving) or "transformers"
    n_threads: int = 0  # CPU threads; 0 = the backend's default (llama.cpp: default_threads())
    n_ctx: int = 2048  # llama.cpp context window in tokens (prompt + generation)
    n_batch: int = 256  # llama.cpp prompt-processing batch size in tokens
    # llama.cpp layers offloaded to the GPU: -1 = all of them when llama.cpp was built with GPU
    # offload (make install GPU=cuda), 0 = keep every layer on the CPU
    n_gpu_layers: int = -1
    max_tokens: int = 256  # default generation budget (chain of thought + final answer line)
    fingerprint_chunk: int = 32  # generated tokens per fingerprint blob
    fingerprint_k: int = 2  # top-|activation| entries kept per position in a fingerprint
    # bytes of the prompts llama.cpp keeps beside its context's own (models.prompt_cache;
    # 0 = only the context's)
    prompt_cache_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.backend not in (LLAMA_CPP, TRANSFORMERS):
            raise ValueError(f"unknown model backend {self.backend!r}: "
                             f"expected {LLAMA_CPP!r} or {TRANSFORMERS!r}")
        for name in ("n_ctx", "n_batch", "max_tokens", "fingerprint_chunk", "fingerprint_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_gpu_layers < -1:
            raise ValueError(f"ModelConfig.n_gpu_layers must be >= -1, got {self.n_gpu_layers}")
        if self.prompt_cache_bytes < 0:
            raise ValueError(f"ModelConfig.prompt_cache_bytes must be >= 0, "
                             f"got {self.prompt_cache_bytes}")
        if self.n_threads < 0:
            raise ValueError(f"ModelConfig.n_threads must be >= 0, got {self.n_threads}")


def default_threads() -> int:
    """The thread count ``n_threads = 0`` stands for: half the logical CPUs (~physical cores).
    llama.cpp's thread barriers spin, and with more threads than free cores (shared or
    hyperthreaded machines) it slows down many-fold."""
    return max(1, (os.cpu_count() or 2) // 2)
