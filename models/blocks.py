"""Layer-sharded inference: a model cut into stages of contiguous decoder blocks.

One implementation of a block: transformers' ``LlamaDecoderLayer``, the very layers
``models.gguf_torch`` builds for the executor's reference path and the layer-state verifier.

* :class:`BlockStage` holds decoder layers [start, end) and nothing else (its parameter memory
  is proportional to end - start). ``forward(hidden (n, C), start_pos, cache)`` runs the new
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


class BlockStage:
    """Decoder layers [start, end) of a llama model, fp32, eval mode."""

    def __init__(self, config: Any, start: int, end: int, state: dict[str, torch.Tensor]) -> None:
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )

        if getattr(config, "_attn_implementation", None) is None:
            config._attn_implementation = "sdpa"  # a standalone layer gets no dispatch otherwise
        self.config, self.start, self.end = config, start, end
        self.hidden_size = int(config.hidden_size)
        layers = []
        for i in range(start, end):
            with torch.device("meta"):
                layer = LlamaDecoderLayer(config, layer_idx=i)
            prefix = f"model.layers.{i}."
            own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            layer.load_state_dict(own, strict=True, assign=True)
            layers.append(layer.eval())
        self.layers = layers
        self.rotary = LlamaRotaryEmbedding(config)
        self.bytes_per_position = bytes_per_position(config, end - start)

    @property
    def param_bytes(self) -> int:
        return sum(p.nbytes for layer in self.layers for p in layer.parameters())

    def forward(self, hidden: np.ndarray, start_pos: int, cache: StageCache,
                blocks: tuple[int, int] | None = None) -> np.ndarray:
        """hidden (n, C) float32 at positions start_pos..start_pos+n-1 -> (n, C) float32,
        through every layer held, or only ``blocks`` [a, b) of them (a sub-range)."""
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
        positions = torch.arange(start_pos, start_pos + n)[None]  # (1, n)
        keys = torch.arange(start_pos + n)
        allowed = positions[0][:, None] >= keys[None, :]  # (n, T): causal
        # additive float mask: what both the eager and the sdpa attention paths accept
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        mask = mask[None, None]  # (1, 1, n, T)
        with torch.no_grad():
            rope = self.rotary(x, position_ids=positions)
            for layer in self.layers[a - self.start:b - self.start]:
                x = layer(x, attention_mask=mask, position_ids=positions,
                          past_key_values=cache, use_cache=True, position_embeddings=rope)
        return x[0].float().numpy()


class Head:
    """The requester's part: embedding (tokens -> hidden) and final norm + output head."""

    def __init__(self, config: Any, state: dict[str, torch.Tensor]) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.config = config
        self.embed = state["model.embed_tokens.weight"]  # (V, C)
        self.lm_head = state.get("lm_head.weight", self.embed)  # (V, C); tied when absent
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm.load_state_dict({"weight": state["model.norm.weight"]}, assign=True)
        self.n_vocab = int(self.embed.shape[0])

    def embed_tokens(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = list(token_ids)
        if any(not 0 <= t < self.n_vocab for t in ids):
            raise ValueError(f"token ids outside [0, {self.n_vocab})")
        return self.embed[torch.tensor(ids, dtype=torch.long)].float().numpy()  # (n, C)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = self.norm(torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32)))
            return (x @ self.lm_head.T).float().numpy()  # (n, V)


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
    from models.gguf_torch import read_gguf

    _, tensors = read_gguf(path)
    return 4 * sum(int(np.prod(t.shape)) for name, t in tensors.items()
                   if name.startswith("blk.0."))


def load_stage(path: str | Path, start: int, end: int) -> BlockStage:
    from models.gguf_torch import load_gguf_part

    config, state = load_gguf_part(path, start, end, head=False)
    return BlockStage(config, start, end, state)


def load_head(path: str | Path) -> Head:
    from models.gguf_torch import load_gguf_part

    config, state = load_gguf_part(path, 0, 0, head=True)
    return Head(config, state)


class LocalTarget:
    """The whole model in this process: embedding, every block, head (the reference)."""

    def __init__(self, head: Head, stage: BlockStage) -> None:
        if (stage.start, stage.end) != (0, int(stage.config.num_hidden_layers)):
            raise ValueError("a LocalTarget needs a stage over every layer")
        self.head, self.stage, self.cache = head, stage, StageCache()

    @classmethod
    def from_gguf(cls, path: str | Path) -> LocalTarget:
        from models.gguf_torch import llama_config, read_gguf

        meta, tensors = read_gguf(path)
        n = int(llama_config(path, meta, tensors).num_hidden_layers)
        return cls(load_head(path), load_stage(path, 0, n))

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
