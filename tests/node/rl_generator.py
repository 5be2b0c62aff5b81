"""Test doubles for the rollout worker's generator: deterministic groups, no model.

Daemon tests load them with ``[rl_worker] generator = "tests.node.rl_generator:honest"`` (or
``:cheat``); they are not shipped and never what a user's node runs. Both hold policy versions
0 and 1 (``SYMPHONY_RL_TEST_VERSIONS``, comma-separated, overrides). ``honest`` answers a job as
asked: the prompts its seed names, ``group_size`` completions each, short token sequences with
log-probabilities in range. ``cheat`` answers easy prompts of its own choosing (0, 1, ...),
which the learner's validation catches.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from crypto.hashing import digest
from protocol.rl.messages import Completion, RolloutJob, RolloutResultBody
from protocol.rl.prompts import job_prompts
from protocol.rl.validation import rollout_commitment

MODEL = "test-rl"
VERSIONS_ENV = "SYMPHONY_RL_TEST_VERSIONS"


class TestGenerator:
    model = MODEL
    model_hash = digest(b"test-rl-weights")
    tokens_per_s = 1000.0

    def __init__(self, cheat: bool) -> None:
        self.cheat = cheat
        raw = os.environ.get(VERSIONS_ENV, "0,1")
        self._versions = {int(v) for v in raw.split(",") if v}

    def versions(self) -> Collection[int]:
        return self._versions

    def generate_group(self, job: RolloutJob, *, worker: str,
                       attempt: int) -> RolloutResultBody:
        prompts = job_prompts(job)
        if self.cheat:
            prompts = tuple(range(len(prompts)))
        completions = tuple(
            Completion(token_ids=tuple(7 * i + t for t in range(3)),
                       logprobs=(-0.5, -1.0, -0.25), finished=True)
            for i in range(job.prompts * job.group_size))
        return RolloutResultBody(job_id=job.job_id, attempt=attempt, worker=worker,
                                 policy_version=job.policy_version, prompt_indices=prompts,
                                 completions=completions, compute_ms=5,
                                 commitment=rollout_commitment(completions),
                                 model_hash=self.model_hash)


def honest(section: Any, data_dir: Path) -> TestGenerator:
    return TestGenerator(cheat=False)


def cheat(section: Any, data_dir: Path) -> TestGenerator:
    return TestGenerator(cheat=True)
