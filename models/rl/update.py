"""One GRPO update of the policy over a batch of groups: in one process, or sharded over the
ranks of ``torch.distributed`` (DDP) when the learner outgrows one device.

:func:`accumulate` computes the gradient of the batch's loss, ``sum_g loss_g / n`` over the
``n`` groups that carry signal (models/rl/grpo.py skips the others), one group's forward and
backward at a time so memory holds one group's activations. Under DDP
(:class:`models.rl.distributed.Ranks`), rank ``r`` of ``W`` takes the useful groups
``r, r + W, ...``; every rank runs the same number of backward passes (a rank short of a group
pads with a zero-weighted copy of the first one, so the collectives line up), DDP averages the
gradients over the ranks at the last backward, and each rank's loss is scaled by ``W`` so that
average is the single-process sum. Every rank then takes the same optimizer step on the same
gradient, so their weights stay equal without any weight broadcast.

The telemetry of the update (:class:`UpdateStats`) is summed over the ranks: the k3 KL of the
policy to the base model per token, the policy's entropy per token, and the clip fraction (the
share of tokens whose importance ratio left the mask bounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import msgpack
import torch

from models.rl.distributed import Ranks
from models.rl.grpo import group_advantages, grpo_loss
from models.rl.policy import Policy, TokenSeq


@dataclass(frozen=True, slots=True)
class Group:
    """One prompt's completions, accepted by the job book, with the learner's rewards."""

    version: int
    prompt_index: int
    prompt_ids: tuple[int, ...]
    completions: tuple[tuple[tuple[int, ...], tuple[float, ...]], ...]  # (token ids, logprobs)
    rewards: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    temperature: float  # the rollouts' sampling temperature: log-probs are taken at it
    max_tokens: int  # the loss's constant normalizer (Dr. GRPO)
    kl_coef: float = 0.0  # weight of the KL-to-base term in the loss
    #: compute the KL to the base policy even when it is not in the loss (one more forward
    #: without gradient per group): the run's telemetry
    measure_kl: bool = True


@dataclass(frozen=True, slots=True)
class UpdateStats:
    useful: int  # groups with signal, over every rank
    skipped: int  # groups with all-equal rewards
    tokens: int
    masked: int  # tokens whose importance ratio left the mask bounds
    loss: float  # mean of the useful groups' losses
    kl: float  # mean k3 KL(policy || base) per token of the useful groups (0 when not measured)
    entropy: float  # mean entropy of the policy per completion token (nats)

    @property
    def clip_fraction(self) -> float:
        return self.masked / self.tokens if self.tokens else 0.0


def _slots(n: int, ranks: Ranks | None) -> list[int | None]:
    """The useful-group indices this rank computes, padded with None to the same count on
    every rank (``ceil(n / W)``)."""
    if ranks is None:
        return list(range(n))
    mine: list[int | None] = list(range(ranks.rank, n, ranks.world))
    return mine + [None] * (-(-n // ranks.world) - len(mine))


def _group_loss(policy: Policy, g: Group, cfg: UpdateConfig, body: torch.nn.Module | None,
                ) -> tuple[torch.Tensor, list[float]]:
    """The group's GRPO loss (with grad) and its [loss, kl * tokens, tokens, masked,
    entropy * tokens] sums."""
    adv = group_advantages(g.rewards)
    assert adv is not None  # only useful groups get here
    seqs = [TokenSeq(g.prompt_ids, ids) for ids, _ in g.completions]
    entropies: list[torch.Tensor] = []
    logp = policy.token_logprobs(seqs, temperature=cfg.temperature, body=body, entropies=entropies)
    base = None
    if cfg.kl_coef > 0 or cfg.measure_kl:
        with torch.no_grad():
            base = policy.token_logprobs(seqs, base=True, temperature=cfg.temperature)
    device = logp[0].device
    behaviour = [torch.tensor(lp, dtype=torch.float32, device=device) for _, lp in g.completions]
    loss, st = grpo_loss(logp, behaviour, adv, max_tokens=cfg.max_tokens, base=base,
                         kl_coef=cfg.kl_coef)
    ent = float(sum(float(e.sum()) for e in entropies))
    return loss, [st.loss, st.kl * st.tokens, float(st.tokens), float(st.masked), ent]


def accumulate(policy: Policy, groups: Sequence[Group], cfg: UpdateConfig,
               ranks: Ranks | None = None) -> UpdateStats:
    """Fill the adapter's ``.grad`` with the batch's gradient (zeroed first); the optimizer
    step is the caller's. Under ``ranks`` every rank must call this with the same groups."""
    for p in policy.parameters():
        p.grad = None
    useful = [g for g in groups if group_advantages(g.rewards) is not None]
    n = len(useful)
    sums = [0.0] * 5
    slots = _slots(n, ranks)
    body = ranks.body(policy) if ranks is not None else None
    scale = float(ranks.world if ranks is not None else 1) / max(n, 1)
    for k, slot in enumerate(slots):
        g = useful[0] if slot is None else useful[slot]
        sync_now = k == len(slots) - 1
        with ranks.no_sync(body, sync_now) if ranks is not None else nullcontext():
            loss, parts = _group_loss(policy, g, cfg, body)
            (loss * (0.0 if slot is None else scale)).backward()
        if slot is not None:
            sums = [a + b for a, b in zip(sums, parts, strict=True)]
    if ranks is not None:
        sums = ranks.sum_floats(sums)
    loss_sum, kl_tok, tokens, masked, ent = sums
    return UpdateStats(useful=n, skipped=len(groups) - n, tokens=int(tokens), masked=int(masked),
                       loss=loss_sum / max(n, 1), kl=kl_tok / max(tokens, 1.0),
                       entropy=ent / max(tokens, 1.0))



#: the largest batch a leader may hand to the other ranks, in groups
MAX_GROUPS = 4096


def encode_groups(version: int, groups: Sequence[Group]) -> bytes:
    """The batch of one step (the version it makes and its groups) as msgpack bytes, what
    rank 0 broadcasts to the other ranks (floats travel as float64: exact)."""
    return msgpack.packb([version, [[g.version, g.prompt_index, list(g.prompt_ids),
                                     [[list(ids), list(lps)] for ids, lps in g.completions],
                                     list(g.rewards)] for g in groups]])


def decode_groups(data: bytes) -> tuple[int, list[Group]]:
    """:func:`encode_groups`'s inverse; ``ValueError`` on bytes it did not make."""
    try:
        version, rows = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
        if len(rows) > MAX_GROUPS:
            raise ValueError(f"{len(rows)} groups (limit {MAX_GROUPS})")
        groups = [Group(int(v), int(i), tuple(int(t) for t in p),
                        tuple((tuple(int(t) for t in ids), tuple(float(x) for x in lps))
                              for ids, lps in comps),
                        tuple(float(r) for r in rewards))
                  for v, i, p, comps, rewards in rows]
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"a batch that does not decode: {exc}") from None
    return int(version), groups
