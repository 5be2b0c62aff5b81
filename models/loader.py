"""Loading a model: a config or a spec in, the backend that runs it out.

The one place that knows every backend class: ``models.backend`` defines the interface and
the backends implement it, so the choice between them sits above both (it imports them only
when asked, so loading one backend never imports the other's libraries).
"""

from __future__ import annotations

from dataclasses import replace

from models.backend import Backend
from models.config import LLAMA_CPP, TRANSFORMERS, ModelConfig
from models.registry import resolve


def load_backend(config: ModelConfig | str | None = None, backend: str | None = None) -> Backend:
    """Load a model by config or spec (None = default model) on the named backend."""
    if not isinstance(config, ModelConfig):
        config = ModelConfig(spec=config or ModelConfig().spec)
    if backend:
        config = replace(config, backend=backend)
    info = resolve(config.spec)
    if config.backend == LLAMA_CPP:
        if info.fmt != "gguf":
            raise ValueError(f"model {info.name!r} is an HF directory: llama.cpp needs a .gguf file "
                             f"(use backend={TRANSFORMERS!r})")
        from models.llama_backend import LlamaCppBackend

        return LlamaCppBackend(info, config)
    from models.hf_backend import TransformersBackend

    return TransformersBackend.load(info, config)
