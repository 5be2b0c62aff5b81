"""Which prompts a rollout job covers: derived from the job's seed, never chosen by a worker.

``prompt_indices(seed, count, dataset_size)`` draws ``count`` distinct indices in
``[0, dataset_size)`` from BLAKE2b of the seed and a counter. It depends on nothing but its
arguments, so the learner (choosing), the worker (generating) and the learner again
(validating a returned group) all get the same list, in the same order.
"""

from __future__ import annotations

import hashlib

from protocol.rl.messages import MAX_DATASET, MAX_PROMPTS_PER_JOB, MAX_SEED, RolloutJob

_PERSON = b"symphony-rl-pr"


def prompt_indices(seed: int, count: int, dataset_size: int) -> tuple[int, ...]:
    """``count`` distinct prompt indices in ``[0, dataset_size)`` for ``seed``, in order."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed {seed} is outside [0, {MAX_SEED}]")
    if not 1 <= dataset_size <= MAX_DATASET:
        raise ValueError(f"dataset_size {dataset_size} is outside [1, {MAX_DATASET}]")
    if not 1 <= count <= min(MAX_PROMPTS_PER_JOB, dataset_size):
        raise ValueError(f"count {count} is outside [1, min({MAX_PROMPTS_PER_JOB}, "
                         f"{dataset_size})]")
    picked: list[int] = []
    counter = 0
    while len(picked) < count:
        digest = hashlib.blake2b(seed.to_bytes(8, "big") + counter.to_bytes(8, "big"),
                                 digest_size=8, person=_PERSON).digest()
        counter += 1
        index = int.from_bytes(digest, "big") % dataset_size
        if index not in picked:
            picked.append(index)
    return tuple(picked)


def job_prompts(job: RolloutJob) -> tuple[int, ...]:
    """The prompt indices ``job`` covers."""
    return prompt_indices(job.prompt_seed, job.prompts, job.dataset_size)
