"""The learner-update tests' pieces: a learner config on the tiny model and a batch of groups."""

from __future__ import annotations

from pathlib import Path

import torch

from models.rl.policy import Policy, TokenSeq
from models.rl.update import Group
from node.rl.learner_config import LearnerConfig
from tests.node.rl_tiny_env import TinyEnv


def learner_config(model: str | Path, out_dir: str | Path) -> LearnerConfig:
    """The tiny model, a large learning rate (one step moves the weights far more than any
    tolerance), short completions."""
    return LearnerConfig(model=str(model), environment="tests.node.rl_tiny_env:make",
                         max_tokens=6, temperature=1.0, lora_rank=4, lora_alpha=8.0,
                         learning_rate=5e-2, learner_threads=1, out_dir=str(out_dir), seed=0)


def make_batch(policy: Policy, groups: int = 4, size: int = 3, seed: int = 11) -> list[Group]:
    """``groups`` groups of ``size`` random completions (1 to 6 tokens) of TinyEnv's prompts,
    their behaviour log-probs the policy's own plus noise (so some ratios leave the mask
    bounds), random rewards; the last group's rewards are all equal (no signal)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(groups):
        prompt = policy.prompt_ids(TinyEnv().prompt(k % TinyEnv.size))
        comps = []
        for _ in range(size):
            n = int(torch.randint(1, 7, (1,), generator=g))
            ids = tuple(int(t) for t in torch.randint(0, 256, (n,), generator=g))
            with torch.no_grad():
                lp = policy.token_logprobs([TokenSeq(prompt, ids)])[0]
            noisy = lp + torch.randn(n, generator=g) * 1.5
            comps.append((ids, tuple(float(x) for x in noisy)))
        rewards = (tuple(float(x) for x in torch.rand(size, generator=g)) if k < groups - 1
                   else (0.5,) * size)
        out.append(Group(0, k % TinyEnv.size, prompt, tuple(comps), rewards))
    return out
