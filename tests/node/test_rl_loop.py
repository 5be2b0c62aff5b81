"""The learner loop's scheduling, with in-test stand-ins for the model side and the worker
processes (the real ones are exercised by test_rl_learner.py): which jobs it issues under
S = 0 and S > 0, which returned groups it trains on or drops as stale, and how it keeps
workers supplied while it trains."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from node.rl.learner import TrainingLoop
from node.rl.learner_config import LearnerConfig
from node.rl.learner_trainer import Group, StepStats
from protocol.codec import decode, encode
from protocol.rl.messages import Completion, RolloutJob, RolloutResultBody
from protocol.rl.prompts import job_prompts
from protocol.rl.validation import rollout_commitment


class Env:
    size = 5


class Trainer:
    """Stands in for node.rl.learner_trainer.Trainer: steps advance the version, nothing else."""

    def __init__(self) -> None:
        self.env, self.vocab_size, self.version, self.resumed_from = Env(), 50, 0, None
        self.published_times = {0: 0.0}
        self.trained_on: list[list[int]] = []  # versions of the groups of each step
        self.mismatch_kls: list[float] = []
        self.steps_done = 0

    def adapter(self, version: int) -> tuple[str, str]:
        return ("", "")

    def check_logprobs(self, job: RolloutJob, result: RolloutResultBody) -> str | None:
        return None

    def groups_of(self, result: RolloutResultBody, job: RolloutJob) -> list[Group]:
        comps = tuple((c.token_ids, c.logprobs) for c in result.completions)
        return [Group(result.policy_version, result.prompt_indices[0], (1,), comps, (0.0, 1.0))]

    def next_version(self) -> int:
        return self.version + 1

    def step(self, groups: list[Group], next_version: int) -> StepStats:
        self.trained_on.append([g.version for g in groups])
        self.version = next_version
        self.published_times[next_version] = 0.0
        self.steps_done += 1
        return StepStats(version=next_version, mean_reward=0.5, groups=len(groups), skipped=0,
                         tokens=2, masked=0, loss=0.0, kl=0.0, step_s=0.0)

    def checkpoint(self) -> None:
        pass


class Pool:
    """Stands in for the worker processes: answers in a scripted order of worker indices, each
    worker its jobs in the order sent. Results arrive only while the learner waits, unless
    ``instant`` (then a result is there as soon as its job is sent)."""

    def __init__(self, order: list[int], instant: bool = False) -> None:
        self.order, self.instant = order, instant
        self.held: dict[int, list[RolloutJob]] = {}
        self.sent: list[tuple[int, int]] = []  # (worker, version)
        self.waits = 0  # gets that would block the learner

    def alive(self, index: int) -> bool:
        return True

    def send(self, index: int, msg: Any) -> None:
        job = decode(msg[0], RolloutJob)
        self.held.setdefault(index, []).append(job)
        self.sent.append((index, job.policy_version))

    def get(self, timeout_s: float) -> tuple[Any, ...] | None:
        holding = bool(self.order and self.held.get(self.order[0]))
        if timeout_s == 0 and not (self.instant and holding):
            return None
        if not holding:
            raise AssertionError(f"the loop waits for worker {self.order[:1]} holding no job")
        self.waits += timeout_s > 0
        i = self.order.pop(0)
        job = self.held[i].pop(0)
        completions = (Completion(token_ids=(3,), logprobs=(-1.0,), finished=True),) * job.group_size
        result = RolloutResultBody(
            job_id=job.job_id, attempt=0, worker=f"local-{i}", policy_version=job.policy_version,
            prompt_indices=job_prompts(job), completions=completions, compute_ms=1,
            commitment=rollout_commitment(completions), model_hash=b"")
        return ("result", i, encode(result), None, 0.1, None)


def _run(tmp_path: Path, order: list[int], instant: bool = False,
         **kw: Any) -> tuple[Trainer, Pool, Any]:
    config = replace(LearnerConfig(group_size=2, jobs_per_step=1, workers=2, steps=3,
                                   out_dir=str(tmp_path)), **kw)
    trainer, pool = Trainer(), Pool(order, instant)
    report = TrainingLoop(config, trainer, pool, None).run()  # type: ignore[arg-type]
    return trainer, pool, report


def test_synchronous_issues_one_steps_jobs_for_the_current_version(tmp_path: Path) -> None:
    trainer, pool, report = _run(tmp_path, [0, 0, 0], staleness=0)
    # one job per step, each for the version being trained; worker 1 never needed
    assert pool.sent == [(0, 0), (0, 1), (0, 2)]
    assert trainer.trained_on == [[0], [1], [2]]
    assert report.counters["stale"] == 0


def test_asynchronous_trains_on_lagging_groups_and_drops_stale_ones(tmp_path: Path) -> None:
    # S = 1: both workers start on version 0; worker 0 is fast, worker 1 answers its version-0
    # job only once the learner trains version 2 (lag 2 > S): dropped as stale
    trainer, pool, report = _run(tmp_path, [0, 0, 1, 0], staleness=1)
    # at most (S + 1) steps' worth of jobs pending, each for the newest version when issued
    assert pool.sent == [(0, 0), (1, 0), (0, 1), (0, 2), (1, 2)]
    assert trainer.trained_on == [[0], [1], [2]]
    assert report.counters["stale"] == 1


def test_a_group_within_the_bound_is_used_after_the_learner_moved_on(tmp_path: Path) -> None:
    trainer, _, report = _run(tmp_path, [0, 1, 0, 1], staleness=1)
    assert trainer.trained_on[:2] == [[0], [0]]  # worker 1's version-0 group at version 1: lag 1
    assert report.counters["stale"] == 0


def test_a_busy_worker_gets_its_next_job_queued_within_the_bound(tmp_path: Path) -> None:
    # S = 2 lets three jobs be pending; two workers take one each, and the third is queued
    # behind worker 0's first rather than waiting for a worker to come free
    trainer, pool, report = _run(tmp_path, [0, 1, 0, 1, 0], staleness=2)
    assert pool.sent[:3] == [(0, 0), (1, 0), (0, 0)]
    assert trainer.trained_on == [[0], [0], [0]]  # lag 0, 1, 2: every group within S
    assert report.counters["stale"] == 0


def test_results_that_arrived_during_a_step_are_taken_before_the_next(tmp_path: Path) -> None:
    # one worker whose results are ready as soon as its jobs are sent: the learner waits only
    # for the very first (the pipeline's fill); afterwards every step finds its group taken in
    # and the worker already holding the next jobs
    trainer, pool, report = _run(tmp_path, [0] * 5, instant=True, staleness=2, workers=1)
    assert pool.waits == 1
    assert trainer.trained_on == [[0], [0], [0]]
    assert report.counters["stale"] == 0


class Evaluator:
    """Stands in for models.rl.heldout.Evaluator: scores each version it is asked about."""

    def __init__(self) -> None:
        self.asked: list[Path | None] = []

    def score(self, adapter: Path | None = None) -> Any:
        from models.rl.heldout import HeldoutScore

        self.asked.append(adapter)
        accuracy = 0.1 * len(self.asked)
        return HeldoutScore(accuracy=accuracy, low=accuracy - 0.05, high=accuracy + 0.05,
                            prompts=10, draws=1)


def test_the_held_out_set_is_scored_at_the_start_and_every_n_steps(tmp_path: Path) -> None:
    import json

    config = LearnerConfig(group_size=2, jobs_per_step=1, workers=1, steps=4, eval_every=2,
                           out_dir=str(tmp_path))
    trainer, evaluator = Trainer(), Evaluator()
    report = TrainingLoop(config, trainer, Pool([0] * 4), None, evaluator).run()  # type: ignore[arg-type]
    assert len(evaluator.asked) == 3  # version 0 (where the run starts), after steps 2 and 4
    assert [h["version"] for h in report.heldout] == [0, 2, 4]
    assert [s.heldout_accuracy for s in report.steps] == [None, pytest.approx(0.2), None,
                                                          pytest.approx(0.3)]
    assert report.steps[1].heldout_half_width == pytest.approx(0.05)
    logged = [json.loads(x) for x in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert [row["version"] for row in logged] == [0, 2, 4]
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert steps[3]["heldout_accuracy"] == pytest.approx(0.3)
    assert all(s["rollout_tokens_per_s"] > 0 for s in steps)  # each step's groups came in
