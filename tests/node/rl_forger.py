"""A test double of a cheating rollout worker on a real model: llama.cpp generates the group
(and takes relayed adapters like an honest worker), then every reported log-probability is
replaced by -0.05, a confident-looking forgery the learner's recomputation must catch. Loaded
with ``[rl_worker] generator = "tests.node.rl_forger:forger"``; never shipped."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from node.rl.rollout_worker import ModelsGenerator
from protocol.rl.messages import RolloutJob, RolloutResultBody


class Forger(ModelsGenerator):
    def generate_group(self, job: RolloutJob, *, worker: str,
                       attempt: int) -> RolloutResultBody:
        body = super().generate_group(job, worker=worker, attempt=attempt)
        fake = tuple(replace(c, logprobs=(-0.05,) * len(c.token_ids)) for c in body.completions)
        return replace(body, completions=fake)


def forger(section: Any, data_dir: Path) -> Forger:
    return Forger(section)
