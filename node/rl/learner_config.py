"""The configuration of `symphony rl train`: one frozen dataclass, read from rl.toml.

Every key of the TOML file is a field below (an unknown key is an error naming it); flags on
the command line override the file. Defaults are sized for the 135M default model on a CPU.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from models.rl.grpo import MISMATCH_KL_MAX
from protocol.rl.staleness import MAX_STALENESS

#: the cheating workers a run can be given (besides "other-model:<model spec>")
CHEATS = ("", "fake-logprobs", "fake-fingerprint", "bad-commitment")


@dataclass(frozen=True, slots=True)
class LearnerConfig:
    model: str = ""  # registry name or .gguf path; "" = the embedded default model
    #: "arith", "evalset", "evalset-cot" or "package.module:factory" (models/rl/env.py)
    environment: str = "evalset"
    steps: int = 20  # optimizer steps to take in this run (after a resume: this many more)
    group_size: int = 8  # completions per prompt, G
    jobs_per_step: int = 1  # groups (jobs of one prompt each) per step: B = jobs_per_step * G
    max_tokens: int = 32  # tokens per completion at most
    #: sampling temperature of rollouts; log-probs on both sides are taken at it. Below 1.0
    #: because SmolLM2-135M sampled at 1.0 rarely reaches an answer, so groups earn no reward
    temperature: float = 0.7
    top_p: float = 1.0
    lora_rank: int = 8
    lora_alpha: float = 16.0
    learning_rate: float = 1e-4  # AdamW on the adapter weights
    weight_decay: float = 0.0
    kl_coef: float = 0.0  # weight of the KL-to-base term; 0 = off (no base forward paid)
    staleness: int = 0  # S: 0 = synchronous (wait for every rollout of the current version)
    workers: int = 2  # local rollout worker processes
    worker_threads: int = 1  # llama.cpp threads per worker
    learner_threads: int = 1  # torch threads of the learner
    checkpoint_every: int = 10  # steps between checkpoints, m
    job_timeout_s: float = 300.0  # a worker's time for one job before it is reissued
    #: largest mean k3 KL between a worker's reported log-probs and the learner's recomputation
    #: (models/rl/grpo.py: where it was measured)
    mismatch_kl_max: float = MISMATCH_KL_MAX
    validate_completions: int = 2  # completions per group whose log-probs are recomputed
    #: steps between held-out evaluations of the newest version (models/rl/heldout.py: greedy
    #: answers to the prompts training never samples); 0 = none during the run
    eval_every: int = 0
    eval_prompts: int = 0  # held-out prompts each evaluation answers; 0 = all of them
    out_dir: str = "out/rl"  # adapters/, checkpoints/, versions.json, steps.jsonl
    seed: int = 0
    #: worker behaviours for tests and demos (node/rl/learner_workers.py): "" honest,
    #: "fake-logprobs", "other-model:<model spec>", "fake-fingerprint", "bad-commitment"
    cheaters: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        positive = ("steps", "group_size", "jobs_per_step", "max_tokens", "lora_rank", "workers",
                    "worker_threads", "learner_threads", "checkpoint_every", "validate_completions")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"rl config: {name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.staleness <= MAX_STALENESS:
            raise ValueError(f"rl config: staleness must be in [0, {MAX_STALENESS}], got {self.staleness}")
        for name in ("lora_alpha", "learning_rate", "job_timeout_s", "mismatch_kl_max"):
            if not getattr(self, name) > 0:
                raise ValueError(f"rl config: {name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.temperature <= 4 or not 0 < self.top_p <= 1:
            raise ValueError("rl config: temperature must be in (0, 4] and top_p in (0, 1]")
        if self.kl_coef < 0 or self.weight_decay < 0:
            raise ValueError("rl config: kl_coef and weight_decay must be >= 0")
        if self.eval_every < 0 or self.eval_prompts < 0:
            raise ValueError("rl config: eval_every and eval_prompts must be >= 0")
        bad = [c for c in self.cheaters if c not in CHEATS
               and not (c.startswith("other-model:") and len(c) > len("other-model:"))]
        if bad or len(self.cheaters) > self.workers:
            raise ValueError(f"rl config: cheaters must list at most {self.workers} of "
                             f"{', '.join(map(repr, CHEATS))}, 'other-model:<model spec>' "
                             f"(got {list(self.cheaters)})")

    @property
    def batch(self) -> int:
        """Rollouts (completions) per step, B."""
        return self.jobs_per_step * self.group_size


def load_config(path: str | Path | None = None, **overrides: Any) -> LearnerConfig:
    """Defaults < the TOML file (top level or an [rl] table) < ``overrides`` (None = unset)."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"rl config {path}: {exc}") from None
        values = dict(data.get("rl", data))
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name: f for f in fields(LearnerConfig)}
    for key in values:
        if key not in known:
            raise ValueError(f"rl config: unknown key {key!r} (known: {', '.join(sorted(known))})")
    if "cheaters" in values:
        values["cheaters"] = tuple(values["cheaters"])
    for key, value in values.items():
        default = getattr(LearnerConfig(), key)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            values[key] = float(value)
        elif type(values[key]) is not type(default):
            raise ValueError(f"rl config: {key} must be of type {type(default).__name__}, "
                             f"got {value!r}")
    return replace(LearnerConfig(), **values)
