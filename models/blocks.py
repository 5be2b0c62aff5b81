"""Layer-sharded inference: a model cut into stages of contiguous decoder blocks.

One implementation of a block: the decoder layers of the model class transformers builds for
the GGUF's architecture (models.gguf_torch), run as that model's forward runs them
(models.hf_layers): the very layers of the executor's reference path and the layer-state
verifier.

* :class:`BlockStage` holds decoder layers [start, end) and nothing else (its parameter memory
  is proportional to end - start). On the CPU they run in fp32; :meth:`BlockStage.to_device`
  moves them to a CUDA device in half precision (:func:`half_dtype`: fp16, bf16 for model
  types whose hidden states overflow fp16); the hidden states in and out stay fp32 numpy. ``forward(hidden (n, C), start_pos, cache)`` runs the new
  positions through its layers, appending their keys and values to ``cache``.
* :class:`StageCache` is one session's attention cache on one stage; ``crop(length)`` keeps
  the first ``length`` positions (rollback after a rejected speculative draft).
* :class:`Head` is what a requester holds: token embedding, final norm and output head.
* :class:`Target` is what a generation loop (plain greedy, speculative decoding) drives:
  ``forward(token_ids, start)`` returns float32 logits, one row per given token, and
  ``rollback(length)``. :class:`LocalTarget` is the single-process reference over the whole
  model; the network chain client (node.inference.chain) implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch


class Target(Protocol):
    """A model a decoding loop can drive position by position, with a rollback."""

    @property
    def n_vocab(self) -> int: ...

    def forward(self, token_ids: Sequence[int], start: int) -> np.ndarray:
        """float32 logits (len(token_ids), n_vocab) for tokens at positions start.., which
        are appended to the caches; ``start`` must equal the current cached length."""
        ...

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` cached positions, drop the rest."""
        ...


class StageCache:
    """Keys and values of one session on one stage: layer index -> (K, V), each
    (1, kv_heads, T, head_dim) fp32. Duck-types the one method transformers' attention calls."""

    def __init__(self) -> None:
        self._kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        held = self._kv.get(layer_idx)
        if held is not None:
            key = torch.cat([held[0], key], dim=2)
            value = torch.cat([held[1], value], dim=2)
        self._kv[layer_idx] = (key, value)
        return key, value

    def held(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Layer index -> its (K, V), as held (models.stage_kv reads a step's rows)."""
        return dict(self._kv)

    @property
    def length(self) -> int:
        for k, _ in self._kv.values():
            return int(k.shape[2])
        return 0

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._kv.values())

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {length}")
        self._kv = {i: (k[:, :, :length], v[:, :, :length]) for i, (k, v) in self._kv.items()}


def bytes_per_position(config: Any, layers: int) -> int:
    """Cache bytes one position costs on a stage of ``layers`` layers (fp32 K and V)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * 4 * layers * int(config.num_key_value_heads) * int(head_dim)


#: model types whose hidden states overflow fp16's range (Gemma's): bf16 on a GPU
BF16_MODEL_TYPES = ("gemma",)


def half_dtype(config: Any) -> torch.dtype:
    """The half precision a stage of this model runs in on a GPU."""
    model_type = str(getattr(config, "model_type", ""))
    return torch.bfloat16 if model_type.startswith(BF16_MODEL_TYPES) else torch.float16


def resolve_device(name: str) -> str:
    """``"auto"`` -> ``"cuda:0"`` when torch sees a CUDA device, else ``"cpu"``; ``"cpu"``,
    ``"cuda"`` and ``"cuda:N"`` are checked against what torch sees (ValueError if absent)."""
    from models.device import parse_device

    kind, index = parse_device(name)
    if kind == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if index is None:
        return kind
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= n:
        raise ValueError(f"device {name!r}: torch sees {n} CUDA device(s)")
    return f"cuda:{index}"


class BlockStage:
    """Decoder layers [start, end) of a transformers causal LM, fp32, eval mode; ``model`` need
    hold weights for those layers only (models.gguf_torch.load_gguf_model)."""

    def __init__(self, model: Any, start: int, end: int) -> None:
        from models.hf_layers import decoder_of

        base = decoder_of(model)
        self.config, self.start, self.end = model.config, start, end
        self.hidden_size = int(self.config.hidden_size)
        self.layers = list(base.layers[start:end])
        self.rotary = base.rotary_emb
        self.bytes_per_position = bytes_per_position(self.config, end - start)
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def to_device(self, device: str) -> BlockStage:
        """Move the layers to ``device`` ("cpu": fp32; "cuda:N": :func:`half_dtype`)."""
        self.device = torch.device(device)
        self.dtype = torch.float32 if self.device.type == "cpu" else half_dtype(self.config)
        for layer in self.layers:
            layer.to(self.device, self.dtype)
        self.rotary.to(self.device)  # its inverse frequencies stay fp32; cos/sin follow x
        return self

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for layer in self.layers for p in layer.parameters())

    def forward(self, hidden: np.ndarray, start_pos: int, cache: StageCache,
                blocks: tuple[int, int] | None = None) -> np.ndarray:
        """hidden (n, C) float32 at positions start_pos..start_pos+n-1 -> (n, C) float32,
        through every layer held, or only ``blocks`` [a, b) of them (a sub-range)."""
        from models.hf_layers import run_layers

        a, b = blocks or (self.start, self.end)
        if not self.start <= a < b <= self.end:
            raise ValueError(f"blocks [{a}, {b}) outside this stage's [{self.start}, {self.end})")
        n = hidden.shape[0]
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size or n == 0:
            raise ValueError(f"hidden states of shape {hidden.shape}, expected (n>0, "
                             f"{self.hidden_size})")
        if start_pos != cache.length:
            raise ValueError(f"positions start at {start_pos}, the cache holds {cache.length}")
        x = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))[None]  # (1, n, C)
        x = x.to(self.device, self.dtype)
        layers = [(i, self.layers[i - self.start]) for i in range(a, b)]
        out = run_layers(self.rotary, self.config, layers, x, start_pos, cache)[-1]
        return out[0].float().cpu().numpy()


class Head:
    """The requester's part: the model's own embedding (tokens -> hidden; Gemma scales it),
    final norm and output head (with the final soft-capping where the config has one)."""

    def __init__(self, model: Any) -> None:
        from models.hf_layers import decoder_of

        base = decoder_of(model)
        self.config = model.config
        self.embed, self.norm, self.lm_head = base.embed_tokens, base.norm, model.lm_head
        self.softcap = getattr(self.config, "final_logit_softcapping", None)
        self.n_vocab = int(self.embed.num_embeddings)

    def embed_tokens(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = list(token_ids)
        if any(not 0 <= t < self.n_vocab for t in ids):
            raise ValueError(f"token ids outside [0, {self.n_vocab})")
        with torch.no_grad():
            return self.embed(torch.tensor(ids, dtype=torch.long)).float().numpy()  # (n, C)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = self.norm(torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32)))
            out = self.lm_head(x)  # (n, V)
            if self.softcap:  # as the model's forward: cap * tanh(logits / cap)
                out = torch.tanh(out / self.softcap) * self.softcap
            return out.float().numpy()


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What a requester and a server must agree on about a model."""

    n_layers: int
    hidden_size: int
    n_vocab: int
    max_positions: int


def shape_of(config: Any) -> ModelShape:
    return ModelShape(int(config.num_hidden_layers), int(config.hidden_size),
                      int(config.vocab_size), int(config.max_position_embeddings))


def bytes_per_block(path: str | Path) -> int:
    """fp32 parameter bytes one decoder block of the GGUF at ``path`` takes once loaded."""
    from models.gguf_reader import read_gguf

    _, tensors = read_gguf(path)
    return 4 * sum(int(np.prod(t.shape)) for name, t in tensors.items()
                   if name.startswith("blk.0."))


def load_stage(path: str | Path, start: int, end: int, device: str = "cpu") -> BlockStage:
    """Blocks [start, end) of the GGUF at ``path`` on ``device`` (see :func:`resolve_device`)."""
    from models.gguf_torch import load_gguf_model

    where = resolve_device(device)
    model, _ = load_gguf_model(path, (start, end), head=False)
    return BlockStage(model, start, end).to_device(where)


def load_head(path: str | Path) -> Head:
    from models.gguf_torch import load_gguf_model

    model, _ = load_gguf_model(path, (0, 0), head=True)
    return Head(model)


class LocalTarget:
    """The whole model in this process: embedding, every block, head (the reference)."""

    def __init__(self, head: Head, stage: BlockStage) -> None:
        if (stage.start, stage.end) != (0, int(stage.config.num_hidden_layers)):
            raise ValueError("a LocalTarget needs a stage over every layer")
        self.head, self.stage, self.cache = head, stage, StageCache()

    @classmethod
    def from_gguf(cls, path: str | Path, device: str = "cpu") -> LocalTarget:
        """The whole model; its blocks on ``device``, the embedding and head on the CPU."""
        from models.gguf_torch import load_gguf_model

        where = resolve_device(device)
        model, _ = load_gguf_model(path)
        stage = BlockStage(model, 0, int(model.config.num_hidden_layers)).to_device(where)
        return cls(Head(model), stage)

    @property
    def n_vocab(self) -> int:
        return self.head.n_vocab

    @property
    def length(self) -> int:
        return self.cache.length

    def forward(self, token_ids: Sequence[int], start: int) -> np.ndarray:
        hidden = self.stage.forward(self.head.embed_tokens(token_ids), start, self.cache)
        return self.head.logits(hidden)

    def rollback(self, length: int) -> None:
        self.cache.crop(length)


def greedy(target: Target, prompt: Sequence[int], max_tokens: int,
           stop: Sequence[int] = ()) -> list[int]:
    """Plain greedy decoding through ``target`` (its caches must be empty): the new tokens."""
    if not prompt:
        raise ValueError("an empty prompt")
    logits = target.forward(prompt, 0)
    out: list[int] = []
    pos = len(prompt)
    while len(out) < max_tokens:
        token = int(np.argmax(logits[-1]))
        out.append(token)
        if token in stop or len(out) == max_tokens:
            break
        logits = target.forward([token], pos)
        pos += 1
    return out
