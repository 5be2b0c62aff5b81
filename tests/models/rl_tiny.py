"""The tiny model's RL pieces shared by the adapter and rollout-check tests: an environment, a
policy, a job, a perturbed adapter and its export to a llama.cpp LoRA GGUF."""

from __future__ import annotations

from pathlib import Path

import torch

from models.rl import export as export_mod
from models.rl import lora
from models.rl.policy import Policy
from protocol.rl.messages import RolloutJob, RolloutSampling


class TinyEnv:
    """A plug-in environment with short prompts (the tiny model has a 512-token context)."""

    size = 4

    def prompt(self, index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Add {index} and 2."}]

    def reward(self, prompt: int, completion: str) -> float:
        return 1.0 if str(prompt + 2) in completion else 0.0


def make_policy(path: Path, seed: int = 0) -> Policy:
    from models.loader import load_backend

    return Policy(load_backend(str(path), backend="transformers"), rank=4, alpha=8.0, seed=seed)


def perturb(policy: Policy, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, m in lora.lora_modules(policy.model):
            m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g) * scale)


def export_adapter(policy: Policy, directory: Path, version: int) -> export_mod.AdapterFile:
    cfg = policy.model.config
    return export_mod.export_adapter(policy.state(), directory, version=version, alpha=policy.alpha,
                                     n_head=cfg.num_attention_heads, n_kv_head=cfg.num_key_value_heads)


def make_job(version: int, seed: int = 5, temperature: float = 1.0) -> RolloutJob:
    return RolloutJob(job_id=bytes([version]) * 16, learner="learner", model="tiny",
                      policy_version=version, adapter_hash=b"", prompt_seed=seed,
                      dataset_size=TinyEnv.size, prompts=2, group_size=3,
                      sampling=RolloutSampling(temperature=temperature, top_p=1.0, max_tokens=12))
