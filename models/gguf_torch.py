"""Build transformers' own model class for a GGUF file, of any architecture both llama.cpp and
transformers load (Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3, ...), dequantized to fp32.

Everything architecture-specific comes from transformers 5's GGUF support: the config keys
(``transformers.integrations.ggml.GGUF_CONFIG_MAPPING``), the model class (``AutoModelFor
CausalLM`` of the config's ``model_type``), the GGUF -> transformers tensor names
(``get_gguf_hf_weights_map``) and each architecture's tensor fix-ups (``TENSOR_PROCESSORS``:
Llama's Q/K row permutation undone, Gemma's norm gains stored as 1 + w, ...). Stages, the
reference path and the layer-state verifier all run that model's own decoder layers.

Why not ``load_gguf_checkpoint`` / ``from_pretrained(gguf_file=...)`` as a whole: they read the
file with ``gguf.GGUFReader``, which decodes the whole tokenizer vocabulary first (seconds for
SmolLM2's 49k tokens, longer for Gemma's 262k), and they dequantize every tensor. Here the
metadata comes from models.gguf_reader (it skips the vocabulary) and only the tensors asked for
are dequantized (``gguf.quants.dequantize``), so a stage's memory grows with its layers only.
What ``load_gguf_checkpoint`` adds to the config beyond its mapping is repeated here for the
architectures that need it (:func:`config_dict`); the tests hold the result equal to its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.building import building

# the reader needs no torch; it lives apart so that the daemon can read a model's metadata
# without importing torch and transformers
from models.gguf_reader import GGUFTensor, read_gguf

#: GGUF architecture -> the name transformers' GGUF mapping knows it by (load_gguf_checkpoint)
_RENAMED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
#: ... and the config's model_type, where that differs again (the text part of a multimodal)
_TEXT_MODEL = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}
#: architectures whose config load_gguf_checkpoint rebuilds from more than its key mapping
#: (encoder-decoders, hybrid recurrent layers, rope scaling read by hand): not repeated here
_UNSUPPORTED = {"t5", "t5encoder", "umt5", "stablelm", "lfm2", "gpt_oss", "minimax_m2",
                "general", "tokenizer"}
#: attention kinds a stage knows how to mask (models.hf_layers)
LAYER_TYPES = ("full_attention", "sliding_attention")


def architecture(path: str | Path, meta: dict[str, Any]) -> tuple[str, str]:
    """(the GGUF's architecture, transformers' name for it); ValueError when transformers
    cannot build it."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    arch = str(meta.get("general.architecture"))
    named = _RENAMED.get(arch, arch)
    if "llama" in arch and meta.get("general.name") == "mistral":  # as load_gguf_checkpoint
        named = "mistral"
    if named not in GGUF_CONFIG_MAPPING or named in _UNSUPPORTED:
        known = sorted(set(GGUF_CONFIG_MAPPING) - _UNSUPPORTED)
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported by the torch "
                         f"loader (transformers builds: {', '.join(known)})")
    return arch, named


def config_dict(path: str | Path, meta: dict[str, Any],
                tensors: dict[str, GGUFTensor]) -> dict[str, Any]:
    """The config keys transformers' ``load_gguf_checkpoint`` derives from this GGUF."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    arch, named = architecture(path, meta)
    cfg: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in tensors
                           or arch in ("falcon", "bloom")}
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(named, {}).items():
        cfg.setdefault(key, value)
    sections = {"general": "general", "tokenizer": "tokenizer", arch: named}
    for key, value in meta.items():
        prefix, _, rest = key.partition(".")
        section = GGUF_CONFIG_MAPPING.get(sections.get(prefix, ""), {})
        renamed = section.get(rest)
        if renamed is not None and renamed != -1:
            cfg[renamed] = value
    cfg["model_type"] = _TEXT_MODEL.get(named, named)
    if "vocab_size" not in cfg:  # transformers counts the vocabulary: the embedding's rows
        cfg["vocab_size"] = int(tensors["token_embd.weight"].shape[0])
    if named == "gemma4":
        cfg["eos_token_id"] = [1, 106, 50]  # as load_gguf_checkpoint: every end-of-turn token
    return cfg


def hf_config(path: str | Path, meta: dict[str, Any], tensors: dict[str, GGUFTensor]) -> Any:
    """transformers' config object for the GGUF (e.g. ``Gemma3TextConfig``); ValueError for an
    architecture it cannot build, or one with a layer kind a stage cannot run."""
    from transformers import AutoConfig

    cfg = config_dict(path, meta, tensors)
    config = AutoConfig.for_model(**cfg)
    kinds = set(getattr(config, "layer_types", None) or ()) - set(LAYER_TYPES)
    if kinds:
        raise ValueError(f"{path}: layers of kind {sorted(kinds)} are not supported (only "
                         f"{', '.join(LAYER_TYPES)})")
    config._attn_implementation = "sdpa"  # the same kernels whichever way the model is built
    return config


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Parameters of the modules this thread creates are put on the meta device (no memory, no
    init), buffers where they are: rotary frequencies and embedding scales are computed from
    the config, not stored in the file, so they must be real.

    torch's parameter registration hook is global (every thread's modules call it), so it
    acts only in the thread that entered the block: a model another thread builds meanwhile
    (the daemon's card embedder) keeps its real weights. It once got them on meta and its
    first forward raised, which ended the daemon."""
    owner = threading.get_ident()

    def to_meta(module: torch.nn.Module, name: str, param: Any) -> Any:
        if param is None or param.device.type == "meta" or threading.get_ident() != owner:
            return None
        return torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    handle = torch.nn.modules.module.register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()


def _block_of(gguf_name: str) -> int | None:
    """The decoder layer a GGUF tensor belongs to ("blk.{i}.…"); None for global tensors."""
    if not gguf_name.startswith("blk."):
        return None
    index = gguf_name.split(".", 2)[1]
    return int(index) if index.isdigit() else None


def _weight_names(model: Any, arch: str, processor: Any) -> dict[str, str]:
    """GGUF tensor name -> transformers parameter name, by gguf's own name tables.

    What transformers' ``get_gguf_hf_weights_map`` computes, without its cost: it builds a
    ``gguf.TensorNameMap`` again for every submodule (seconds per model); this builds one and
    tries each parameter's full name, then the name below the top module (its recursion's
    first level, which is where a wrapped ``XModel`` meets names like ``layers.0...``)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    key = next((k for k, v in MODEL_ARCH_NAMES.items() if v == arch), None)
    if key is None:
        raise ValueError(f"GGUF architecture {arch!r} is unknown to the gguf package")
    table = get_tensor_name_map(key, int(model.config.num_hidden_layers))
    names: dict[str, str] = {}
    for full in model.state_dict(keep_vars=True):
        hf_name = processor.preprocess_name(full)
        base, dot, suffix = hf_name.rpartition(".")
        if suffix not in ("weight", "bias"):
            base, dot, suffix = hf_name, "", ""
        for candidate in (base, base.partition(".")[2]):
            gguf_name = table.get_name(candidate) if candidate else None
            if gguf_name is not None:
                names.setdefault(gguf_name + dot + suffix, hf_name)
                break
        else:
            processor.perform_fallback_tensor_mapping(names, dot + suffix, "", hf_name)
    return names


def _dequantized(tensors: dict[str, GGUFTensor], arch: str, config: dict[str, Any],
                 model: Any, wanted: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """fp32 parameters by transformers name, of the GGUF tensors ``wanted`` accepts, through
    the architecture's own tensor processor (what load_gguf_checkpoint does per tensor)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config)
    names = _weight_names(model, arch, processor)
    parsed: dict[str, Any] = {"config": config, "tensors": {}}
    for name, tensor in tensors.items():
        if not wanted(name):
            continue
        w = dequantize(np.asarray(tensor.data), GGMLQuantizationType(tensor.ggml_type))
        w = np.asarray(w, dtype=np.float32).reshape(tensor.shape)  # (rows, cols)
        out = processor.process(weights=w, name=name, tensor_key_mapping=names,
                                parsed_parameters=parsed)
        if out.name in names:
            parsed["tensors"][names[out.name]] = torch.from_numpy(np.array(out.weights,
                                                                           copy=True))
    state: dict[str, torch.Tensor] = parsed["tensors"]
    return state


def load_gguf_model(path: str | Path, layers: tuple[int, int] | None = None,
                    head: bool = True) -> tuple[Any, dict[str, Any]]:
    """(transformers' causal LM for the GGUF in fp32 eval mode, GGUF metadata).

    ``layers`` = (start, end) loads decoder layers [start, end) only (default: all), ``head``
    the embedding, final norm and output head; every other parameter stays on the meta device
    (no memory), so a stage of a layer-sharded chain dequantizes nothing it does not run.
    ValueError for an architecture transformers cannot build or a range outside the model.
    Builds inside models.building.building (one build at a time in the process)."""
    with building():
        return _load_gguf_model(path, layers, head)


def _load_gguf_model(path: str | Path, layers: tuple[int, int] | None,
                     head: bool) -> tuple[Any, dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    meta, tensors = read_gguf(path)
    config = hf_config(path, meta, tensors)
    n = int(config.num_hidden_layers)
    start, end = layers if layers is not None else (0, n)
    if not 0 <= start <= end <= n:
        raise ValueError(f"{path}: layer range [{start}, {end}) is outside the model's {n} layers")
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config)

    def wanted(name: str) -> bool:
        block = _block_of(name)
        return head if block is None else start <= block < end

    state = _dequantized(tensors, architecture(path, meta)[0],
                         config_dict(path, meta, tensors), model, wanted)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings and head:
        model.tie_weights()
    scope = tuple(f"model.layers.{i}." for i in range(start, end))
    missing = [name for name, p in model.named_parameters() if p.device.type == "meta"
               and (name.startswith(scope) or (head and not name.startswith("model.layers.")))]
    if missing:
        raise ValueError(f"{path}: GGUF file lacks tensors for {sorted(missing)[:5]}")
    return model.eval(), meta


def loaded_parameters(model: Any) -> list[str]:
    """Names of the parameters that hold weights (not left on the meta device)."""
    return [name for name, p in model.named_parameters() if p.device.type != "meta"]
