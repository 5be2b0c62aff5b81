"""`symphony rl train`: a GRPO learner fed by local rollout workers, with bounded staleness.

The loop drives the same job book a network learner drives (protocol/rl/jobs.py: issue,
assign, judge each returned group, reissue on a deadline or a failed check) and the same
worker function (models/rl/rollout.py); only the transport differs: local processes and
queues here, the task market and the weight relay on the network.

- ``staleness = 0`` (synchronous): the learner issues exactly the jobs of one step for the
  version it holds, waits for them, trains, publishes; workers idle while it trains.
- ``staleness = S > 0`` (asynchronous): workers get jobs for the newest version at once, up
  to (S + 1) steps' worth issued or waiting; a group of version ``v`` is trained on at version
  ``w`` only if ``w - v <= S`` (protocol/rl/staleness.py), otherwise dropped and counted as
  stale.

The learner hands out jobs only between its steps, so a worker holds more than one: the one it
generates and the next, queued in its process (protocol/rl/capacity.py ``jobs_per_worker``,
from the measured step and generation times), and results that arrived during a step are taken
in before the next one starts. A worker that finishes during a step starts its next job at once
instead of idling until the step ends.

Every returned group is validated before use (the book's model-free checks, then the
learner's log-prob recomputation under the group's version); a failure excludes its worker for
the run and reissues the job. The learner never waits past a job's deadline.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from models.config import DEFAULT_MODEL_NAME
from models.rl.distributed import Ranks
from models.rl.env import load_environment, load_heldout
from models.rl.heldout import EvalSettings, Evaluator, HeldoutScore
from node.rl.learner_config import LearnerConfig
from node.rl.learner_ranks import follow
from node.rl.learner_trainer import Group, StepStats, Trainer
from node.rl.learner_workers import WorkerPool
from node.rl.step_figures import RolloutRate
from protocol.codec import decode, encode
from protocol.rl.capacity import jobs_per_worker
from protocol.rl.jobs import ACCEPTED, INVALID, BookConfig, JobBook, Verdict
from protocol.rl.messages import RolloutJob, RolloutResultBody, RolloutSampling
from protocol.rl.staleness import accepts

#: a worker that fails this many jobs in a row stops the run (a broken set-up, not bad luck)
MAX_WORKER_ERRORS = 3


@dataclass
class TrainReport:
    steps: list[StepStats] = field(default_factory=list)
    wall_s: float = 0.0
    busy_s: float = 0.0  # learner compute: GRPO steps, exports and validation recomputes
    first_version: int = 0
    resumed_from: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    swap_s: list[float] = field(default_factory=list)  # publish -> worker serving it
    switch_s: list[float] = field(default_factory=list)  # adapter load + switch on a worker
    generate_s: list[float] = field(default_factory=list)  # per job on a worker
    excluded: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    mismatch_kls: list[float] = field(default_factory=list)  # of every group validated
    #: a torchrun rank other than 0: the steps it took with rank 0 (None on rank 0)
    follower_steps: int | None = None
    heldout: list[dict[str, Any]] = field(default_factory=list)  # every held-out evaluation
    last_adapter: str = ""  # the adapter file of the last version ("" = the base model)

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def last_version(self) -> int:
        return self.steps[-1].version if self.steps else self.first_version


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class TrainingLoop:
    """One local training run: the job book hands rollout jobs to ``pool``'s workers, their
    groups train ``trainer`` step by step, ``on_step`` hears each step's stats. Its pool and
    trainer are arguments, so a test drives the loop's scheduling with its own."""

    def __init__(self, config: LearnerConfig, trainer: Trainer, pool: WorkerPool,
                 on_step: Callable[[StepStats], None] | None,
                 evaluator: Evaluator | None = None) -> None:
        self.config, self.trainer, self.pool, self.on_step = config, trainer, pool, on_step
        sampling = RolloutSampling(temperature=config.temperature, top_p=config.top_p,
                                   max_tokens=config.max_tokens)
        self.book = JobBook(BookConfig(
            learner="local", model=config.model or DEFAULT_MODEL_NAME,
            dataset_size=trainer.env.size, vocab_size=trainer.vocab_size, prompts_per_job=1,
            group_size=config.group_size, sampling=sampling, max_staleness=config.staleness,
            job_ms=int(config.job_timeout_s * 1000)),
            random.Random(config.seed), checks=(self._check,), version=trainer.version)
        self.open_jobs: deque[RolloutJob] = deque()
        self.jobs: dict[bytes, RolloutJob] = {}
        self.running: dict[bytes, int] = {}  # job id -> worker index, until the book ends it
        #: jobs sent to each worker that it has not answered yet (a result or an error each)
        self.held = [0] * config.workers
        self.errors: dict[int, int] = {}
        self.ready: list[Group] = []
        self.report = TrainReport(first_version=trainer.version, resumed_from=trainer.resumed_from)
        self.stale_at_step = 0
        self.evaluator = evaluator
        #: completion tokens returned since the last step ended, for its tokens/s
        self.rollout_rate = RolloutRate(time.monotonic())

    def _check(self, job: RolloutJob, result: RolloutResultBody) -> str | None:
        t = time.perf_counter()
        try:
            return self.trainer.check_logprobs(job, result)
        finally:
            self.report.busy_s += time.perf_counter() - t

    # ------------------------------------------------------------ main loop
    def run(self) -> TrainReport:
        t0 = time.monotonic()
        if self.evaluator is not None and self.config.eval_every:
            self._score(self.trainer.version)  # where the run starts from
        while len(self.report.steps) < self.config.steps:
            self._expire()
            self._collect()
            self._dispatch()
            if len(self.ready) >= self.config.jobs_per_step:
                self._train()
                continue
            self._wait()
        self.report.wall_s = time.monotonic() - t0
        self.report.last_adapter = self.trainer.adapter(self.trainer.version)[0]
        if self.trainer.steps_done % self.config.checkpoint_every:
            self.trainer.checkpoint()  # a clean end resumes exactly where it stopped
        self.report.counters = dict(self.book.counters)
        self.report.counters["stale"] = self.book.counters["stale"] + self.stale_at_step
        self.report.excluded = sorted(self.book.excluded)
        self.report.mismatch_kls = list(self.trainer.mismatch_kls)
        return self.report

    def _train(self) -> None:
        batch = self.ready[:self.config.jobs_per_step]
        self.ready = self.ready[self.config.jobs_per_step:]
        stats = self.trainer.step(batch, self.trainer.next_version())
        stats = replace(stats, rollout_tokens_per_s=self.rollout_rate.rate(time.monotonic()))
        self.report.busy_s += stats.step_s
        self.book.publish(self.trainer.version)
        stats = self._heldout(stats)
        self.rollout_rate.restart(time.monotonic())
        keep = [g for g in self.ready if accepts(g.version, self.trainer.version, self.config.staleness)]
        self.stale_at_step += len(self.ready) - len(keep)
        self.ready = keep
        self.report.steps.append(stats)
        self._log(stats)
        if self.on_step is not None:
            self.on_step(stats)

    def _heldout(self, stats: StepStats) -> StepStats:
        every = self.config.eval_every
        if self.evaluator is None or not every or self.trainer.steps_done % every:
            return stats
        score = self._score(stats.version)
        return replace(stats, heldout_accuracy=score.accuracy,
                       heldout_half_width=score.half_width)

    def _score(self, version: int) -> HeldoutScore:
        assert self.evaluator is not None
        t = time.perf_counter()
        path, _ = self.trainer.adapter(version)
        score = self.evaluator.score(Path(path) if path else None)
        self.report.busy_s += time.perf_counter() - t
        row = {"version": version, **score.as_dict()}
        self.report.heldout.append(row)
        with open(Path(self.config.out_dir) / "heldout.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        return score

    def _log(self, stats: StepStats) -> None:
        path = Path(self.config.out_dir) / "steps.jsonl"
        with open(path, "a") as f:
            f.write(json.dumps({**asdict(stats), "staleness": self.config.staleness}) + "\n")

    # ------------------------------------------------------------ jobs
    def _wanted(self) -> bool:
        """Whether one more job should be issued now. Synchronous: until the current version's
        step is covered. Asynchronous: until (S + 1) steps' worth of groups are ready or in
        flight, enough for the learner never to wait when the capacity rule holds, and no more
        (a group generated further ahead would only turn stale)."""
        w = self.trainer.version
        running = [self.jobs[j] for j in self.running]
        if self.config.staleness == 0:
            running = [j for j in running if j.policy_version == w]
        pending = len(self.ready) + len(self.open_jobs) + len(running)
        return pending < self.config.jobs_per_step * (self.config.staleness + 1)

    def _depth(self) -> int:
        """Jobs a worker may hold, from the step and generation times measured so far."""
        steps, gens = self.report.steps, self.report.generate_s
        return jobs_per_worker(sum(s.step_s for s in steps) / len(steps) if steps else None,
                               sum(gens) / len(gens) if gens else None)

    def _dispatch(self) -> None:
        """Hand out open and wanted jobs, each to the usable worker holding the fewest."""
        depth = self._depth()
        usable = [i for i in range(self.config.workers)
                  if self.pool.alive(i) and self.book.eligible(f"local-{i}")]
        if not usable:
            raise RuntimeError("every rollout worker has died or been excluded for cheating")
        while (free := [i for i in usable if self.held[i] < depth]) and (
                self.open_jobs or self._wanted()):
            i = min(free, key=lambda k: (self.held[k], k))
            job = self.open_jobs.popleft() if self.open_jobs else self.book.new_job(_now_ms())
            self.book.assign(job.job_id, f"local-{i}", _now_ms(),
                             int(self.config.job_timeout_s * 1000))
            self.jobs[job.job_id] = job
            self.running[job.job_id] = i
            self.held[i] += 1
            path, sha = self.trainer.adapter(job.policy_version)
            self.pool.send(i, (encode(job), job.policy_version, path, sha,
                               self.trainer.published_times[job.policy_version]))

    def _expire(self) -> None:
        for verdict in self.book.expire(_now_ms()):
            self._ended(verdict)

    def _ended(self, verdict: Verdict) -> None:
        """Bookkeeping for jobs a verdict ended (and the jobs it reissued). A worker still
        holds an ended job until it answers (or dies): ``held`` counts it until then."""
        ended = {verdict.job_id, *verdict.cancelled}
        for job_id in ended:
            self.running.pop(job_id, None)
            self.jobs.pop(job_id, None)
        self.open_jobs = deque(j for j in self.open_jobs if j.job_id not in ended)
        self.open_jobs.extend(verdict.reissued)

    def _collect(self) -> None:
        """Take in every message that arrived meanwhile (during a step), without waiting."""
        while (msg := self.pool.get(0.0)) is not None:
            self._handle(msg)

    def _wait(self) -> None:
        deadline = self.book.next_deadline()
        timeout = 1.0 if deadline is None else min(1.0, max(0.0, (deadline - _now_ms()) / 1000))
        msg = self.pool.get(timeout)
        if msg is not None:
            self._handle(msg)

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind, i = msg[0], msg[1]
        self.held[i] = max(0, self.held[i] - 1)
        if kind == "error":
            self.errors[i] = self.errors.get(i, 0) + 1
            self.report.errors.append(msg[2])
            if self.errors[i] >= MAX_WORKER_ERRORS:
                raise RuntimeError(f"rollout worker {i} failed {MAX_WORKER_ERRORS} jobs: {msg[2]}")
            return  # its job stays running until its deadline, then it is reissued
        self.errors[i] = 0
        if kind != "result" or len(msg) != 6:
            raise RuntimeError(f"rollout worker {i} sent an unexpected {kind!r} message "
                               f"of {len(msg)} fields: {[type(x).__name__ for x in msg]}")
        _, _, data, swap_s, generate_s, switch_s = msg
        if swap_s is not None:
            self.report.swap_s.append(swap_s)
            self.report.switch_s.append(switch_s)
        self.report.generate_s.append(generate_s)
        result = decode(data, RolloutResultBody)
        self.rollout_rate.add(sum(len(c.token_ids) for c in result.completions))
        job = self.jobs.get(result.job_id)
        verdict = self.book.receive(result, f"local-{i}", _now_ms())
        if self.running.get(result.job_id) == i:
            del self.running[result.job_id]
        if verdict.outcome == ACCEPTED and job is not None:
            self.ready.extend(self.trainer.groups_of(result, job))
        if verdict.outcome in (ACCEPTED, "stale", INVALID, "excluded"):
            self._ended(verdict)


def run_training(config: LearnerConfig,
                 on_step: Callable[[StepStats], None] | None = None) -> TrainReport:
    """Train ``config.steps`` steps with ``config.workers`` local rollout workers."""
    Path(config.out_dir).mkdir(parents=True, exist_ok=True)
    ranks = Ranks.from_env()  # started by torchrun: the update runs on every rank
    if ranks is not None and not ranks.leader:
        try:
            return TrainReport(follower_steps=follow(config, ranks))
        finally:
            ranks.close()
    env = load_environment(config.environment)
    trainer = Trainer(config, env, ranks)
    evaluator = heldout_evaluator(config) if config.eval_every else None
    try:
        pool = WorkerPool.start(config.workers, config.model, config.environment,
                                config.worker_threads, config.cheaters)
        try:
            return TrainingLoop(config, trainer, pool, on_step, evaluator).run()
        finally:
            pool.stop()
    finally:
        trainer.stop_ranks()
        if evaluator is not None:
            evaluator.close()
        if ranks is not None:
            ranks.close()


def heldout_evaluator(config: LearnerConfig) -> Evaluator:
    """A held-out evaluator for ``config``'s model and environment: greedy answers of at most
    ``max_tokens`` tokens, on the learner's threads."""
    from models.rl.rollout import RolloutWorker

    settings = EvalSettings(prompts=config.eval_prompts, max_tokens=config.max_tokens)
    worker = RolloutWorker(config.model or None, n_threads=config.learner_threads)
    return Evaluator(worker, load_heldout(config.environment), settings)


def summary(report: TrainReport) -> dict[str, Any]:
    """The figures `rl train` prints at the end."""
    rewards = [s.mean_reward for s in report.steps]
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return {
        "steps": len(report.steps), "first_version": report.first_version,
        "last_version": report.last_version, "resumed_from": report.resumed_from,
        "wall_s": round(report.wall_s, 2), "busy_fraction": round(report.busy_fraction, 3),
        "reward_first": round(rewards[0], 3) if rewards else None,
        "reward_last": round(rewards[-1], 3) if rewards else None,
        "reward_mean": round(mean(rewards), 3),
        "skipped_groups": sum(s.skipped for s in report.steps),
        "masked_tokens": sum(s.masked for s in report.steps),
        "accepted": report.counters.get("accepted", 0), "stale": report.counters.get("stale", 0),
        "invalid": report.counters.get("invalid", 0), "timeout": report.counters.get("timeout", 0),
        "excluded": report.excluded, "swap_s": round(mean(report.swap_s), 4),
        "switch_s": round(mean(report.switch_s), 5),
        "generate_s": round(mean(report.generate_s), 3),
        "step_s": round(mean([s.step_s for s in report.steps]), 3),
        "kl_last": round(report.steps[-1].kl, 5) if report.steps else None,
        "entropy_last": round(report.steps[-1].entropy, 4) if report.steps else None,
        "clip_fraction": round(mean([s.clip_fraction for s in report.steps]), 4),
        "rollout_tokens_per_s": round(mean([s.rollout_tokens_per_s for s in report.steps]), 2),
        "heldout": report.heldout,
    }
