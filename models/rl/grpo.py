"""The GRPO objective (Dr. GRPO advantages, token-level importance ratios with masking).

For a group of G completions of one prompt with rewards ``r``:

- advantage ``A_i = r_i - mean(r)`` (Dr. GRPO: no division by the group's standard deviation,
  which over-weights groups whose rewards barely differ). A group whose rewards are all equal
  has every ``A_i = 0``: it carries no signal, and :func:`group_advantages` says so, so the
  learner counts it and skips it instead of paying for its forward and backward passes;
- each token's importance ratio ``rho = exp(logp_now - logp_behaviour)`` against the
  log-probability the worker reported when it sampled the token; tokens whose ratio leaves
  ``[RATIO_LOW, RATIO_HIGH]`` are masked out (no gradient), as prime-rl / INTELLECT-2 do for
  off-policy rollouts, and counted;
- loss ``= -sum(rho * A) / (G * max_tokens)`` over unmasked tokens: a constant normalizer
  (Dr. GRPO), not a per-sequence mean that would favour short wrong answers;
- optionally ``kl_coef`` times the k3 estimate of KL(policy || base) per token
  (``exp(b - p) - (b - p) - 1 >= 0``), same normalizer; given the base model's log-probs the
  estimate is measured (the run's telemetry) even with ``kl_coef = 0``.

:func:`mismatch_kl` is the validation figure: how far a worker's reported log-probabilities sit
from the learner's own recomputation under the same version (the k3 estimate, tokens sampled
from the worker's distribution).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: token-level importance-ratio mask bounds (prime-rl's defaults)
RATIO_LOW, RATIO_HIGH = 0.125, 8.0
#: the validation threshold on :func:`mismatch_kl` per group. Measured on SmolLM2-135M,
#: llama.cpp Q4_1 (the worker) vs the dequantized fp32 torch policy (the learner), honest
#: groups at T = 0.7 and 1.0, base and adapted: 0.002 to 0.0076 (18 groups); a forger that
#: reports confident log-probs (-0.05 a token) for the same tokens: 0.37 to 0.54.
MISMATCH_KL_MAX = 0.05


def group_advantages(rewards: Sequence[float]) -> list[float] | None:
    """``r_i - mean(r)`` per completion, or None when every reward is equal (no signal)."""
    if not rewards:
        raise ValueError("a group needs at least one reward")
    if max(rewards) - min(rewards) <= 1e-9:
        return None
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


@dataclass(frozen=True, slots=True)
class LossStats:
    loss: float
    tokens: int  # completion tokens in the group
    masked: int  # tokens whose importance ratio left [RATIO_LOW, RATIO_HIGH]
    mean_ratio: float  # over unmasked tokens
    kl: float  # mean k3 KL(policy || base) per token (0 when ``base`` is not given)


def grpo_loss(logp: Sequence[torch.Tensor], behaviour: Sequence[torch.Tensor],
              advantages: Sequence[float], *, max_tokens: int,
              base: Sequence[torch.Tensor] | None = None, kl_coef: float = 0.0,
              ratio_low: float = RATIO_LOW, ratio_high: float = RATIO_HIGH,
              ) -> tuple[torch.Tensor, LossStats]:
    """The loss of one group. ``logp[i]`` (T_i,) with grad: the policy's log-probabilities of
    completion i's tokens; ``behaviour[i]`` (T_i,) the worker's; ``base[i]`` (T_i,) the base
    model's (needed when ``kl_coef > 0``)."""
    if not len(logp) == len(behaviour) == len(advantages):
        raise ValueError("logp, behaviour and advantages must have one entry per completion")
    if kl_coef > 0 and base is None:
        raise ValueError("kl_coef > 0 needs the base model's log-probabilities")
    norm = float(len(logp) * max_tokens)
    total = torch.zeros((), device=logp[0].device if len(logp) else None)
    tokens = masked = 0
    ratio_sum, kl_sum, kept = 0.0, 0.0, 0
    for i, (lp, bp, adv) in enumerate(zip(logp, behaviour, advantages, strict=True)):
        if lp.shape != bp.shape:
            raise ValueError(f"completion {i}: {tuple(lp.shape)} log-probs vs {tuple(bp.shape)} reported")
        ratio = torch.exp(lp - bp)  # (T,)
        keep = (ratio >= ratio_low) & (ratio <= ratio_high)
        tokens += int(lp.numel())
        masked += int((~keep).sum())
        kept += int(keep.sum())
        ratio_sum += float(ratio.detach()[keep].sum())
        total = total - (ratio * keep * adv).sum() / norm
        if base is not None:  # measured whenever given, in the loss only with a weight
            d = base[i] - lp  # (T,)
            k3 = torch.exp(d) - d - 1.0
            kl_sum += float(k3.detach().sum())
            if kl_coef > 0:
                total = total + kl_coef * k3.sum() / norm
    stats = LossStats(loss=float(total.detach()), tokens=tokens, masked=masked,
                      mean_ratio=ratio_sum / max(kept, 1), kl=kl_sum / max(tokens, 1))
    return total, stats


def mismatch_kl(reported: Sequence[float], recomputed: Sequence[float]) -> float:
    """Mean k3 estimate of KL(worker || learner) over the tokens the worker sampled:
    ``mean(exp(q - p) - (q - p) - 1)`` with p the reported and q the recomputed log-probs."""
    if len(reported) != len(recomputed):
        raise ValueError(f"{len(reported)} reported log-probs vs {len(recomputed)} recomputed")
    if not reported:
        return 0.0
    p = torch.tensor(list(reported), dtype=torch.float64)
    q = torch.tensor(list(recomputed), dtype=torch.float64)
    d = q - p
    return float((torch.exp(d) - d - 1.0).mean())
