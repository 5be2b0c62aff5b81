"""Low-rank adapters (LoRA) on every linear layer of a llama model's decoder blocks.

``y = W x + (alpha / r) * B (A x)`` with the base ``W`` frozen; ``A`` (r, in) starts from a
seeded Kaiming-uniform draw and ``B`` (out, r) at zero, so a fresh adapter computes exactly the
base model. Our own small module rather than ``peft``: the learner needs only the forward, the
A/B pairs for the llama.cpp export and a switch to the base (for the KL term), and ``peft``
would add ``accelerate`` to the install for that.

The adapted layers are the seven projections of each block (``q, k, v, o, gate, up, down``);
the output head is left alone (SmolLM2 ties it to the token embeddings). ``lora_state`` names
each pair by the transformers parameter it adapts, e.g. ``model.layers.3.self_attn.q_proj``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

#: the linear layers of a llama block that get an adapter (transformers attribute paths)
TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable rank-``rank`` update scaled by ``alpha / rank``."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha = rank, alpha
        self.scale = alpha / rank
        self.enabled = True
        a = torch.empty(rank, base.in_features)  # (r, in)
        bound = 1.0 / math.sqrt(base.in_features)  # nn.Linear's kaiming_uniform(a=sqrt(5)) bound
        a.uniform_(-bound, bound, generator=generator)
        self.lora_a = nn.Parameter(a)
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))  # (out, r)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        y = self.base(x)
        if not self.enabled:
            return y
        return y + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def apply_lora(model: nn.Module, rank: int = 8, alpha: float = 16.0, seed: int = 0) -> list[str]:
    """Freeze ``model`` and wrap every target linear layer in a :class:`LoRALinear`, in place.
    Returns the adapted layer names, in a fixed order (block by block, TARGETS order)."""
    if rank < 1 or alpha <= 0:
        raise ValueError(f"LoRA needs rank >= 1 and alpha > 0 (got rank={rank}, alpha={alpha})")
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    names = []
    layers = model.model.layers  # type: ignore[union-attr]
    for i, block in enumerate(layers):  # type: ignore[arg-type]
        for target in TARGETS:
            owner_path, attr = target.split(".")
            owner = getattr(block, owner_path)
            base = getattr(owner, attr)
            if isinstance(base, LoRALinear):
                raise ValueError(f"model.layers.{i}.{target} already carries a LoRA adapter")
            setattr(owner, attr, LoRALinear(base, rank, alpha, generator))
            names.append(f"model.layers.{i}.{target}")
    return names


def lora_modules(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            yield name, module


def lora_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{"<layer>.lora_a": (r, in), "<layer>.lora_b": (out, r)}``: detached fp32 copies."""
    out: dict[str, torch.Tensor] = {}
    for name, m in lora_modules(model):
        out[f"{name}.lora_a"] = m.lora_a.detach().clone()
        out[f"{name}.lora_b"] = m.lora_b.detach().clone()
    return out


def load_lora_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy adapter weights into ``model``; every adapted layer must be present, shapes equal."""
    expected = set()
    with torch.no_grad():
        for name, m in lora_modules(model):
            for part, param in (("lora_a", m.lora_a), ("lora_b", m.lora_b)):
                key = f"{name}.{part}"
                expected.add(key)
                if key not in state:
                    raise ValueError(f"adapter state lacks {key}")
                if tuple(state[key].shape) != tuple(param.shape):
                    raise ValueError(f"adapter state {key} has shape {tuple(state[key].shape)}, "
                                     f"the model expects {tuple(param.shape)}")
                param.copy_(state[key])
    extra = set(state) - expected
    if extra:
        raise ValueError(f"adapter state has layers the model lacks: {sorted(extra)[:3]}")


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for _, m in lora_modules(model) for p in (m.lora_a, m.lora_b)]


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base (every adapter off) inside the block."""
    mods = [m for _, m in lora_modules(model)]
    for m in mods:
        m.enabled = False
    try:
        yield
    finally:
        for m in mods:
            m.enabled = True
