"""The RL loop end to end on a local testnet: a learner daemon and three rollout-worker daemons
(loopback, port 0) on the tiny model. The learner (this process, through its daemon's API)
trains with GRPO and relays every version's adapter; workers fetch it through the weight relay
and hot-swap it into llama.cpp without reloading the base model, keeping the last three; jobs
for a new version are only won by workers that hold it; groups that fall past S are dropped;
a worker forging log-probabilities is convicted and excluded."""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from node.rl.dissemination import adapter_name
from node.rl.learner_config import LearnerConfig
from node.rl.step_figures import step_telemetry

from .conftest import CONVERGE_S, Testnet, run_cli

ENV = "tests.node.rl_tiny_env:make"


def _worker(model: Path, generator: str) -> dict[str, Any]:
    return {"rl_worker": {"generator": generator, "model": str(model), "environment": ENV,
                          "threads": 1}}


def _rl_worker(node: Any) -> dict[str, Any]:
    return node.status()["services"]["rl_worker"]  # type: ignore[no-any-return]


def _wait_swapped(testnet: Testnet, workers: list[Any], version: int,
                  published_at: float) -> list[float]:
    """Wait until every worker serves ``version``; publish-to-swap seconds for each."""
    def swapped() -> list[float] | None:
        times = []
        for node in workers:
            swaps = (_rl_worker(node)["adapters"] or {}).get("swaps", [])
            mine = [s["ready_at"] for s in swaps if s["version"] == version]
            if not mine:
                return None
            times.append(mine[-1] - published_at)
        return times

    result: list[float] = testnet.wait_until(swapped, f"version {version} on every worker",
                                             timeout_s=60)
    return result


@pytest.mark.integration
def test_learner_and_three_workers_on_a_testnet(testnet: Testnet, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("llama_cpp")
    from node.rl.network_learner import DaemonApi, NetworkLearner
    from tests.models import tiny

    started = time.monotonic()
    model = tiny.write_gguf(tiny.tiny_model(seed=0), tmp_path / "tiny.gguf")
    env = {"OMP_NUM_THREADS": "1"}
    learner_node = testnet.start("learner", env=env, config={"rl_jobs": {"bid_window_ms": 1500}})
    forger = testnet.start("forger", bootstrap=[learner_node], env=env,
                           config=_worker(model, "tests.node.rl_forger:forger"))
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(lambda: _rl_worker(forger)["enabled"], "the forger's generator up",
                       timeout_s=60)
    config = LearnerConfig(model=str(model), environment=ENV, steps=2, group_size=4,
                           jobs_per_step=1, max_tokens=6, lora_rank=4, lora_alpha=8.0,
                           learning_rate=5e-2, staleness=1, checkpoint_every=10,
                           out_dir=str(tmp_path / "learner"), job_timeout_s=60.0)
    learner = NetworkLearner(config, DaemonApi.of(learner_node.data_dir))
    learner.begin()

    # version 0 (the base): the forger, alone so far, wins a job and is caught by the check
    learner.issue(1)

    def caught() -> bool:
        learner.collect()
        return forger.peer_id in learner.report.convicted

    testnet.wait_until(caught, "the forger convicted", timeout_s=60)
    assert forger.peer_id in learner.jobs_status()["excluded"]
    honest = [testnet.start(f"worker{i}", bootstrap=[learner_node], wait=False, env=env,
                            config=_worker(model, "models")) for i in range(2)]
    for node in honest:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(lambda: all(_rl_worker(n)["enabled"] for n in honest),
                       "the honest generators up", timeout_s=60)
    up_s = time.monotonic() - started

    # the forger's job reissued to an honest worker; three more jobs at version 0
    learner.issue(3)
    deadline = time.monotonic() + 90
    while len(learner.ready) < 4:
        assert time.monotonic() < deadline, (learner.report, learner.jobs_status())
        learner.collect()
    assert learner.report.convicted == [forger.peer_id]  # honest groups pass the check
    assert {g.version for g in learner.ready} == {0}
    held_back = len(learner.ready)

    # two steps from the version-0 groups: at version 2 the ones left are past S = 1
    swaps: list[float] = []
    for version in (1, 2):
        stats = learner.step()
        assert stats.version == version
        published = learner.report.published[-1]
        swaps += _wait_swapped(testnet, honest, version, published.published_at)
    assert learner.report.stale == held_back - 2
    assert not learner.ready

    # two more steps in the loop: jobs for versions 2 and 3 go to workers holding them
    learner.run(2)
    assert [s.version for s in learner.report.steps] == [1, 2, 3, 4]
    # each step's mean reward and telemetry went to the daemon with its version: the
    # dashboard's curve and /metrics
    assert learner.jobs_status()["steps"] == [
        {"version": s.version, "mean_reward": s.mean_reward, "heldout_accuracy": None,
         **step_telemetry(s)} for s in learner.report.steps]
    published = learner.report.published[-1]
    swaps += _wait_swapped(testnet, honest, 4, published.published_at)
    for node in honest:
        worker = _rl_worker(node)
        assert worker["versions"] == [0, 2, 3, 4]  # the last three adapters and the base
        assert worker["adapters"]["artifact"] == adapter_name("tiny")
        files = sorted(p.name.partition("-")[0] for p in (node.data_dir / "rl_adapters").glob("*.gguf"))
        assert files == ["v2", "v3", "v4"]
    assert learner.jobs_status()["version"] == 4
    assert sum(_rl_worker(n)["generated"] for n in honest) >= 4
    relay = learner_node.status()["services"]["relay"]
    assert relay["chunks_out"] >= 1
    # a restarted learner resumes at version 4 (already relayed) and goes on from there
    again = NetworkLearner(config, DaemonApi.of(learner_node.data_dir))
    assert again.trainer.version == 4
    again.begin()
    again.run(1)
    assert [s.version for s in again.report.steps] == [5]
    assert [s["version"] for s in again.jobs_status()["steps"]] == [1, 2, 3, 4, 5]
    swaps += _wait_swapped(testnet, honest, 5, again.report.published[-1].published_at)
    assert [p.version for p in again.report.published] == [5]

    parts = [s for n in honest for s in _rl_worker(n)["adapters"]["swaps"]]
    print(f"publish-to-swap over the relay: mean {sum(swaps) / len(swaps):.3f} s, "
          f"max {max(swaps):.3f} s over {len(swaps)} swaps (export from the relay store "
          f"{max(s['export_s'] for s in parts):.4f} s, llama.cpp load and switch "
          f"{max(s['load_s'] for s in parts):.4f} s at most); testnet up in {up_s:.1f} s, "
          f"test {time.monotonic() - started:.1f} s")


class _RecordingApi:
    """The learner's daemon as far as publish() calls it: each call kept, fixed answers."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        self.calls.append((method, path, kwargs.get("json")))
        return {"id": "ab"} if path == "/relay/publish" else {}


@pytest.mark.parametrize(("reward", "sent"), [
    (0.375, {"version": 3, "mean_reward": 0.375}),
    (None, {"version": 3}),  # a resumed version: its step ran before this learner
    (math.nan, {"version": 3}),  # a user environment's bad reward does not stop the training
    (1e9, {"version": 3}),
])
def test_a_published_version_carries_its_steps_mean_reward(
        tmp_path: Path, reward: float | None, sent: dict[str, Any]) -> None:
    pytest.importorskip("torch")
    from node.rl.network_learner import NetworkLearner

    api = _RecordingApi()
    trainer = SimpleNamespace(adapter=lambda version: (f"/a/v{version}.gguf", "00"))
    learner = NetworkLearner(LearnerConfig(out_dir=str(tmp_path)), api,  # type: ignore[arg-type]
                             model="tiny", trainer=trainer)  # type: ignore[arg-type]
    learner.publish(3, reward)
    assert api.calls[-1] == ("POST", "/rl_jobs/version", sent)
    # a step's telemetry goes with its mean reward, and only with it
    measured = {"kl": 0.5, "entropy": 1.0, "clip_fraction": 0.0, "staleness": 1.0,
                "rollout_tokens_per_s": 3.0}
    learner.publish(3, reward, measured)
    expected = {**sent, **measured} if "mean_reward" in sent else sent
    assert api.calls[-1] == ("POST", "/rl_jobs/version", expected)


def test_the_network_learners_steps_report_their_rollout_tokens_per_s(tmp_path: Path) -> None:
    """The network learner counts the completion tokens of the groups it receives and reports
    their rate with each step, in its stats and in the version it publishes (it left the
    figure at 0); the next step counts afresh."""
    pytest.importorskip("torch")
    from node.rl.learner_trainer import StepStats
    from node.rl.network_learner import NetworkLearner
    from protocol.rl.messages import Completion, RolloutResultBody

    class _Trainer:
        version = 0

        def adapter(self, version: int) -> tuple[str, str]:
            return f"/a/v{version}.gguf", "00"

        def check_logprobs(self, shape: object, result: object) -> None:
            return None

        def groups_of(self, result: object, shape: object) -> list[object]:
            return [object()]

        def next_version(self) -> int:
            return self.version + 1

        def step(self, batch: list[object], version: int) -> StepStats:
            self.version = version
            return StepStats(version=version, mean_reward=0.5, groups=len(batch), skipped=0,
                             tokens=9, masked=0, loss=0.0, kl=0.0, step_s=0.0)

    def result(tokens: int) -> RolloutResultBody:
        done = Completion(token_ids=tuple(range(tokens)), logprobs=(-1.0,) * tokens,
                          finished=True, fingerprint=b"")
        return RolloutResultBody(job_id=b"\1" * 16, attempt=0, worker="w", policy_version=0,
                                 prompt_indices=(0,), completions=(done, done, done),
                                 compute_ms=1, commitment=b"", model_hash=b"")

    api = _RecordingApi()
    learner = NetworkLearner(LearnerConfig(out_dir=str(tmp_path), jobs_per_step=1), api,  # type: ignore[arg-type]
                             model="tiny", trainer=_Trainer())  # type: ignore[arg-type]
    learner.rollout_rate.since = time.monotonic() - 3.0  # the groups took at least 3 s
    assert learner._receive(result(4)) == 1
    stats = learner.step()
    assert 0.0 < stats.rollout_tokens_per_s <= 12 / 3.0
    (sent,) = [body for method, path, body in api.calls if path == "/rl_jobs/version"]
    assert sent["rollout_tokens_per_s"] == stats.rollout_tokens_per_s
    assert learner.rollout_rate.tokens == 0  # counting afresh for the next step


def test_rollout_rate_is_tokens_since_the_last_restart_over_the_time() -> None:
    from node.rl.step_figures import RolloutRate

    rate = RolloutRate(10.0)
    rate.add(30)
    rate.add(15)
    assert rate.rate(13.0) == 15.0
    rate.restart(13.0)
    assert rate.rate(14.0) == 0.0
    assert rate.rate(13.0) == 0.0  # no time passed: no division by zero


def test_network_training_without_a_daemon_says_so(tmp_path: Path) -> None:
    result = run_cli("rl", "train", "--network", "--data-dir", str(tmp_path / "nowhere"),
                     "--steps", "1")
    assert result.returncode != 0
    assert "daemon" in result.stderr and "Traceback" not in result.stderr, result.stderr
