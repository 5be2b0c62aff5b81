"""Shared builders for the rollout-job tests: a job and an honest result answering it."""

from __future__ import annotations

from dataclasses import replace

from protocol.rl.messages import Completion, RolloutJob, RolloutResultBody, RolloutSampling
from protocol.rl.prompts import job_prompts
from protocol.rl.validation import rollout_commitment

VOCAB = 1000


def make_job(**overrides: object) -> RolloutJob:
    fields: dict[str, object] = dict(
        job_id=bytes(range(32)), learner="learner", model="smollm2-135m", policy_version=3,
        adapter_hash=b"\x01" * 32, prompt_seed=42, dataset_size=100, prompts=2, group_size=4,
        sampling=RolloutSampling(temperature=1.0, top_p=0.95, max_tokens=8))
    fields.update(overrides)
    return RolloutJob(**fields)  # type: ignore[arg-type]


def honest_result(job: RolloutJob, worker: str = "worker", attempt: int = 0,
                  version: int | None = None) -> RolloutResultBody:
    completions = tuple(
        Completion(token_ids=tuple((7 * i + t) % VOCAB for t in range(3 + i % 3)),
                   logprobs=tuple(-0.5 - 0.1 * t for t in range(3 + i % 3)), finished=True)
        for i in range(job.prompts * job.group_size))
    return RolloutResultBody(
        job_id=job.job_id, attempt=attempt, worker=worker,
        policy_version=job.policy_version if version is None else version,
        prompt_indices=job_prompts(job), completions=completions, compute_ms=1200,
        commitment=rollout_commitment(completions), model_hash=b"\x03" * 32)


def with_completion(result: RolloutResultBody, index: int, c: Completion) -> RolloutResultBody:
    items = list(result.completions)
    items[index] = c
    return replace(result, completions=tuple(items), commitment=rollout_commitment(items))
