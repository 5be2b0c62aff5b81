"""The learner's policy: the default model in fp32 torch (dequantized from its GGUF) with LoRA.

:class:`Policy` wraps a transformers backend (models.hf_backend: the GGUF dequantized by
models.gguf_torch, llama.cpp's own tokenizer) whose model carries the adapters of
models.rl.lora. It computes the log-probability of every completion token given its prompt,
batched over a group, with or without gradient, under the adapter or under the base model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.backend import Backend, Message
from models.config import TRANSFORMERS, ModelConfig
from models.rl import lora


@dataclass(frozen=True, slots=True)
class TokenSeq:
    """One completion to score: the prompt's token ids and the completion's."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


class Policy:
    """A LoRA-adapted causal LM. Not thread-safe."""

    def __init__(self, backend: Backend, rank: int = 8, alpha: float = 16.0, seed: int = 0) -> None:
        self.backend = backend
        self.model: torch.nn.Module = backend.model  # type: ignore[attr-defined]
        self.rank, self.alpha = rank, alpha
        self.layers = lora.apply_lora(self.model, rank, alpha, seed)
        self.model.eval()  # no dropout anywhere: train mode would change nothing but flags

    @classmethod
    def load(cls, spec: str | None = None, *, rank: int = 8, alpha: float = 16.0, seed: int = 0,
             n_threads: int = 0) -> Policy:
        from models.loader import load_backend

        config = ModelConfig(spec=spec or ModelConfig().spec, backend=TRANSFORMERS,
                             n_threads=n_threads)
        return cls(load_backend(config), rank, alpha, seed)

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.backend.eos_ids

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)  # type: ignore[union-attr]

    def prompt_ids(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return tuple(self.backend.prompt_ids(list(messages)))

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.backend.detokenize([t for t in ids if t not in self.eos_ids])

    def parameters(self) -> list[torch.nn.Parameter]:
        return lora.trainable_parameters(self.model)

    def state(self) -> dict[str, torch.Tensor]:
        return lora.lora_state(self.model)

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        lora.load_lora_state(self.model, state)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def token_logprobs(self, seqs: Sequence[TokenSeq], *, base: bool = False,
                       temperature: float = 1.0, body: torch.nn.Module | None = None,
                       entropies: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Log-probability of each completion token at ``temperature`` (``log_softmax(logits /
        T)``), one (T_i,) tensor per sequence; with gradient when grad is enabled. ``base``:
        under the base model (adapters off). ``body``: the module that runs the decoder
        (``self.model.model`` or a wrapper of it, e.g. DDP's). ``entropies``: filled with each
        sequence's per-token entropy of that distribution, (T_i,) detached."""
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if base:
            with lora.adapters_disabled(self.model):
                return self._token_logprobs(seqs, temperature, body=body, entropies=entropies)
        return self._token_logprobs(seqs, temperature, body=body, entropies=entropies)

    def logprobs_and_states(self, seqs: Sequence[TokenSeq], *, temperature: float = 1.0,
                            ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """:meth:`token_logprobs` under the adapter, and from the same forward pass each
        completion token's final-norm hidden state at its own position, (T_i, C) per
        sequence: what a worker's fingerprint of the completion commits to."""
        states: list[torch.Tensor] = []
        return self._token_logprobs(seqs, temperature, states), states

    def _token_logprobs(self, seqs: Sequence[TokenSeq], temperature: float,
                        states: list[torch.Tensor] | None = None, *,
                        body: torch.nn.Module | None = None,
                        entropies: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        if not seqs:
            return []
        vocab = self.vocab_size
        full = [list(s.prompt_ids) + list(s.completion_ids) for s in seqs]
        for s in seqs:
            if not s.prompt_ids:
                raise ValueError("a sequence needs a non-empty prompt")
            if any(not 0 <= t < vocab for t in s.completion_ids):
                raise ValueError(f"completion token id outside the vocabulary [0, {vocab})")
        length = max(len(f) for f in full)
        ids = torch.zeros(len(full), length, dtype=torch.long)  # (B, L), right-padded
        mask = torch.zeros(len(full), length, dtype=torch.long)
        for i, f in enumerate(full):
            ids[i, :len(f)] = torch.tensor(f)
            mask[i, :len(f)] = 1
        decoder = self.model.model if body is None else body
        device = self.device
        ids, mask = ids.to(device), mask.to(device)
        hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L, C)
        rows, targets, sizes = [], [], []
        for i, s in enumerate(seqs):
            n, t = len(s.prompt_ids), len(s.completion_ids)
            rows.append(hidden[i, n - 1:n - 1 + t])  # position p predicts token p + 1
            if states is not None:
                states.append(hidden[i, n:n + t])
            targets.extend(s.completion_ids)
            sizes.append(t)
        h = torch.cat(rows)  # (N, C)
        logits = self.model.lm_head(h).float() / temperature  # (N, V)
        logp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(targets, dtype=torch.long, device=device).view(-1, 1)
        picked = logp.gather(1, target).squeeze(1)  # (N,)
        if entropies is not None:
            ent = -(logp.detach().exp() * logp.detach()).sum(-1)  # (N,)
            entropies.extend(torch.split(ent, sizes))
        return list(torch.split(picked, sizes))
