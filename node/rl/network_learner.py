"""A GRPO learner on the network: rollout jobs through its daemon's market, adapters by the relay.

The learner process drives its own daemon over the local HTTP API (the daemon runs
``[rl_jobs]`` and the relay): it starts a run (``POST /rl_jobs/run``), keeps rollout jobs in
flight (``/rl_jobs/issue``), takes the groups the daemon's job book accepted (``GET
/rl_jobs/groups``), checks each by recomputing its log-probabilities under the group's version
(node/rl/learner_trainer.py; a failure is ``POST /rl_jobs/convict``: the worker is attested,
excluded for the run and the job reissued), trains with GRPO and publishes every new version:
the adapter GGUF through the weight relay as ``rl-adapter/<model>`` (node/rl/dissemination.py)
and the version to the job book (``POST /rl_jobs/version``, with the step's mean reward for the
daemon's dashboard), so workers bid once they hold it.

Bounded staleness: a group of version ``v`` is trained on at version ``w`` only if
``0 <= w - v <= S`` (protocol/rl/staleness.py); groups that fall behind while they wait are
dropped and counted, beside those the daemon's book dropped on arrival. With ``S = 0`` the
learner issues one step's jobs and waits for them; with ``S > 0`` it keeps ``(S + 1)`` steps'
worth of groups ready or in flight.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from models.rl.env import load_environment
from node.rl.dissemination import adapter_name, run_model_name
from node.rl.learner_config import LearnerConfig
from node.rl.learner_trainer import Group, StepStats, Trainer
from node.rl.step_figures import MAX_ABS_REWARD, RolloutRate, step_telemetry
from protocol.rl.messages import Completion, RolloutResultBody
from protocol.rl.staleness import accepts

#: seconds one ``GET /rl_jobs/groups`` waits for a first group
POLL_WAIT_S = 2.0


class LearnerApiError(RuntimeError):
    """The learner's daemon refused a call (its answer's error text is the message)."""


class DaemonApi:
    """The learner's daemon: its API URL and token (every call carries the token)."""

    def __init__(self, api_url: str, token: str, *, timeout_s: float = 60.0) -> None:
        self.client = httpx.Client(base_url=api_url, timeout=timeout_s,
                                   headers={"Authorization": f"Bearer {token}"})

    @classmethod
    def of(cls, data_dir: Path) -> DaemonApi:
        from node.api.token import read_token
        from node.control import read_daemon_info

        return cls(read_daemon_info(Path(data_dir)).api_url, read_token(Path(data_dir)))

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise LearnerApiError(f"{method} {path}: the learner's daemon does not answer at "
                                  f"{self.client.base_url}: {exc}") from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("error", response.text)
            except ValueError:
                detail = response.text
            raise LearnerApiError(f"{method} {path}: {response.status_code} {detail}")
        return response.json()

    def close(self) -> None:
        self.client.close()


class _Shape(NamedTuple):
    """What the trainer reads of a job to split a result into groups: its group size."""

    group_size: int


@dataclass(frozen=True, slots=True)
class Published:
    version: int
    manifest: str  # hex id of the relay manifest
    published_at: float  # wall-clock time.time() when the publish call was made
    publish_s: float  # chunking, signing and announcing on the learner's daemon


@dataclass
class NetworkReport:
    steps: list[StepStats] = field(default_factory=list)
    published: list[Published] = field(default_factory=list)
    convicted: list[str] = field(default_factory=list)  # workers whose group failed the check
    stale: int = 0  # groups that fell past S while waiting here
    received: int = 0
    wall_s: float = 0.0


def group_result(data: dict[str, Any]) -> RolloutResultBody:
    """A group as ``GET /rl_jobs/groups`` serves it, back as the result body it came in."""
    completions = tuple(Completion(token_ids=tuple(c["token_ids"]), logprobs=tuple(c["logprobs"]),
                                   finished=bool(c["finished"]),
                                   fingerprint=bytes.fromhex(c.get("fingerprint", "")))
                        for c in data["completions"])
    return RolloutResultBody(job_id=bytes.fromhex(data["job_id"]), attempt=0,
                             worker=str(data["worker"]), policy_version=int(data["version"]),
                             prompt_indices=tuple(data["prompt_indices"]),
                             completions=completions, compute_ms=int(data["compute_ms"]),
                             commitment=bytes.fromhex(data.get("commitment", "")),
                             model_hash=b"")


def shown_reward(mean_reward: float | None) -> bool:
    """Whether the daemon takes ``mean_reward`` for its dashboard: a user environment's reward
    that is not finite or past ``MAX_ABS_REWARD`` is left out rather than stop the training."""
    return mean_reward is not None and math.isfinite(mean_reward) \
        and abs(mean_reward) <= MAX_ABS_REWARD


class NetworkLearner:
    def __init__(self, config: LearnerConfig, api: DaemonApi, *, model: str = "",
                 job_ms: int | None = None, trainer: Trainer | None = None,
                 on_step: Callable[[StepStats], None] | None = None) -> None:
        Path(config.out_dir).mkdir(parents=True, exist_ok=True)
        self.config, self.api = config, api
        self.trainer = trainer or Trainer(config, load_environment(config.environment))
        #: the run's model name: what workers' generators call the model they serve
        self.model = model or run_model_name(config.model)
        self.job_ms = job_ms or int(config.job_timeout_s * 1000)
        self.ready: list[Group] = []
        self.report = NetworkReport()
        self.on_step = on_step
        #: completion tokens received since the last step ended, for its tokens/s
        self.rollout_rate = RolloutRate(time.monotonic())

    # ------------------------------------------------------------ the daemon's side
    def begin(self) -> None:
        """A new run at the trainer's version; a resumed version's adapter is relayed first."""
        c, t = self.config, self.trainer
        self.api.call("POST", "/rl_jobs/run", json={
            "model": self.model, "dataset_size": t.env.size, "vocab_size": t.vocab_size,
            "group_size": c.group_size, "prompts_per_job": 1, "max_tokens": c.max_tokens,
            "temperature": c.temperature, "top_p": c.top_p, "staleness": c.staleness,
            "job_ms": self.job_ms, "version": t.version})
        if t.version > 0 and not self._relayed(t.version):
            self.publish(t.version)
        elif t.version > 0:
            self.api.call("POST", "/rl_jobs/version", json={"version": t.version})

    def _relayed(self, version: int) -> bool:
        """Whether the daemon's relay already holds ``version`` (or a newer one) of our
        adapters (a learner restarted beside a daemon that kept running)."""
        name, me = adapter_name(self.model), self.api.call("GET", "/status")["peer_id"]
        versions = self.api.call("GET", "/relay/status")["versions"]
        return any(v["name"] == name and v["signer"] == me and v["version"] >= version
                   for v in versions)

    def publish(self, version: int, mean_reward: float | None = None,
                measured: dict[str, float] | None = None) -> Published:
        """Relay ``version``'s adapter and make it the job book's version; ``mean_reward`` and
        ``measured`` (node/rl/step_figures.py's telemetry): those of the step that made it
        (None for a resumed version, whose step ran before)."""
        path, _ = self.trainer.adapter(version)
        start, at = time.perf_counter(), time.time()
        answer = self.api.call("POST", "/relay/publish", json={
            "path": path, "name": adapter_name(self.model), "version": version,
            "format": "gguf"})
        published = Published(version, str(answer["id"]), at, time.perf_counter() - start)
        figures = ({"mean_reward": mean_reward, **(measured or {})}
                   if shown_reward(mean_reward) else {})
        self.api.call("POST", "/rl_jobs/version", json={"version": version, **figures})
        self.report.published.append(published)
        return published

    def jobs_status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.api.call("GET", "/status")["services"]["rl_jobs"]
        return status

    def issue(self, count: int) -> None:
        self.api.call("POST", "/rl_jobs/issue", json={"count": count})

    # ------------------------------------------------------------ groups
    def collect(self, wait_s: float = POLL_WAIT_S) -> int:
        """Take the groups the daemon accepted; check and keep them; how many were kept."""
        answer = self.api.call("GET", "/rl_jobs/groups", params={"max": 64, "wait_s": wait_s})
        kept = 0
        for data in answer["groups"]:
            kept += self._receive(group_result(data))
        return kept

    def _receive(self, result: RolloutResultBody) -> int:
        self.report.received += 1
        self.rollout_rate.add(sum(len(c.token_ids) for c in result.completions))
        w = self.trainer.version
        if not accepts(result.policy_version, w, self.config.staleness):
            self.report.stale += 1
            return 0
        shape = _Shape(len(result.completions) // max(1, len(result.prompt_indices)))
        reason = self.trainer.check_logprobs(shape, result)  # type: ignore[arg-type]
        if reason is not None:
            self.api.call("POST", "/rl_jobs/convict",
                          json={"job_id": result.job_id.hex(), "reason": reason})
            self.report.convicted.append(result.worker)
            return 0
        groups = self.trainer.groups_of(result, shape)  # type: ignore[arg-type]
        self.ready.extend(groups)
        return len(groups)

    # ------------------------------------------------------------ training
    def step(self) -> StepStats:
        """One GRPO step on the oldest ready groups, then publish the new version."""
        batch = self.ready[:self.config.jobs_per_step]
        self.ready = self.ready[self.config.jobs_per_step:]
        stats = self.trainer.step(batch, self.trainer.next_version())
        # tokens received since the previous step over the time since: the swarm generates
        # while the learner trains, so the interval is the whole step
        now = time.monotonic()
        stats = replace(stats, rollout_tokens_per_s=self.rollout_rate.rate(now))
        self.rollout_rate.restart(now)
        self.publish(stats.version, stats.mean_reward, step_telemetry(stats))
        keep = [g for g in self.ready
                if accepts(g.version, self.trainer.version, self.config.staleness)]
        self.report.stale += len(self.ready) - len(keep)
        self.ready = keep
        self.report.steps.append(stats)
        if self.on_step is not None:
            self.on_step(stats)
        return stats

    def wanted(self) -> int:
        """Jobs to issue now so that (S + 1) steps' worth of groups are ready or coming."""
        status = self.jobs_status()
        pending = len(self.ready) + int(status["in_flight"]) + int(status["waiting_groups"])
        return max(0, self.config.jobs_per_step * (self.config.staleness + 1) - pending)

    def run(self, steps: int | None = None, *, timeout_s: float = 3600.0) -> NetworkReport:
        """Train ``steps`` (default: the config's) steps; a run past ``timeout_s`` stops with
        an error naming how far it got."""
        goal = len(self.report.steps) + (steps or self.config.steps)
        start = time.monotonic()
        while len(self.report.steps) < goal:
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"{len(self.report.steps)} of {goal} steps in {timeout_s:.0f} s "
                                   f"(status: {self.jobs_status()})")
            if len(self.ready) >= self.config.jobs_per_step:
                self.step()
                continue
            if want := self.wanted():
                self.issue(want)
            self.collect()
        self.report.wall_s += time.monotonic() - start
        if self.trainer.steps_done % self.config.checkpoint_every:
            self.trainer.checkpoint()  # a restart resumes exactly where this run stopped
        return self.report


def run_network(config: LearnerConfig, data_dir: Path,
                on_step: Callable[[StepStats], None] | None = None) -> dict[str, Any]:
    """`symphony rl train --network`: ``config.steps`` steps through the daemon of
    ``data_dir`` (it must run ``[rl_jobs]``); the figures it prints at the end."""
    api = DaemonApi.of(data_dir)
    try:
        learner = NetworkLearner(config, api, on_step=on_step)
        learner.begin()
        report = learner.run(timeout_s=max(3600.0, config.steps * config.job_timeout_s))
        status = learner.jobs_status()
    finally:
        api.close()
    rewards = [s.mean_reward for s in report.steps]
    return {"steps": len(report.steps), "last_version": learner.trainer.version,
            "wall_s": round(report.wall_s, 2),
            "reward_first": round(rewards[0], 3) if rewards else None,
            "reward_last": round(rewards[-1], 3) if rewards else None,
            "received": report.received, "stale": report.stale + int(status["book"].get("stale", 0)),
            "convicted": sorted(set(report.convicted)), "excluded": status["excluded"],
            "publish_s": round(sum(p.publish_s for p in report.published)
                               / max(1, len(report.published)), 4)}
