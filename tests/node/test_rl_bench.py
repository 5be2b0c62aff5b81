"""`symphony bench rl`'s figures and its sizing by the capacity rule, on recorded run reports
(an in-test stand-in for run_training: the real runs are the bench itself)."""

from __future__ import annotations

from typing import Any

import pytest

from models.rl.heldout import HeldoutScore
from node.bench.rl import bench as bench_rl
from node.rl.learner import TrainReport
from node.rl.learner_trainer import StepStats

KEYS = {"busy_sync", "busy_async", "time_ratio_async_vs_sync", "reward_sync", "reward_async",
        "stale_dropped", "swap_s", "heldout_base", "heldout_trained_sync",
        "heldout_trained_async", "heldout_ci95"}


def _report(step_s: float, generate_s: float, wall_s: float, reward: float, stale: int = 0,
            n: int = 2) -> TrainReport:
    steps = [StepStats(version=v, mean_reward=reward + 0.01 * v, groups=1, skipped=0, tokens=10,
                       masked=0, loss=0.0, kl=0.0, step_s=step_s) for v in range(1, n + 1)]
    return TrainReport(steps=steps, wall_s=wall_s, busy_s=2 * step_s, counters={"stale": stale},
                       swap_s=[0.01], generate_s=[generate_s] * 3,
                       last_adapter=f"adapter-{reward}.gguf")


#: the held-out scores stand-in (the real one loads the model): base, then one per adapter
SCORED: list[tuple[list[str], int]] = []


def _scores(config: Any, adapters: list[str], prompts: int) -> list[HeldoutScore]:
    SCORED.append((adapters, prompts))
    accuracy = [0.25, 0.5, 0.75]
    return [HeldoutScore(accuracy=a, low=a - 0.05 * (i + 1), high=a + 0.05 * (i + 1), prompts=40,
                         draws=1) for i, a in enumerate(accuracy)]


def _relayed(run_dir: Any, workers: int) -> list[float]:
    """The relayed swaps stand-in: node/bench/rl/swaps.py starts daemons."""
    return [1.0, 2.0]


def _run(monkeypatch: pytest.MonkeyPatch, sync: TrainReport, asyn: TrainReport) -> tuple[dict[str, Any], list[Any]]:
    configs: list[Any] = []

    def fake_run_training(config: Any, on_step: Any = None) -> TrainReport:
        configs.append(config)
        return sync if config.staleness == 0 else asyn

    monkeypatch.setattr("node.rl.learner.run_training", fake_run_training)
    monkeypatch.setattr("node.bench.rl.swaps.relayed_swaps_of_run", _relayed)
    monkeypatch.setattr(bench_rl, "score_heldout", _scores)
    return bench_rl.run(quick=True), configs


def test_the_figures_are_exactly_the_named_keys(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # 8 rollouts in 2 s per worker (r = 4/s) against B / T = 8 / 10 s: one worker suffices
    figures, configs = _run(monkeypatch, _report(10.0, 2.0, 30.0, 0.2),
                            _report(10.0, 2.0, 21.0, 0.3, stale=1))
    assert set(figures) == KEYS
    assert figures["busy_sync"] == pytest.approx(20 / 30, abs=1e-3)
    assert figures["busy_async"] == pytest.approx(20 / 21, abs=1e-3)
    assert figures["time_ratio_async_vs_sync"] == pytest.approx(0.7)
    assert figures["reward_sync"] == pytest.approx(0.215)  # mean of 0.21 and 0.22
    assert (figures["reward_async"], figures["stale_dropped"]) == (pytest.approx(0.315), 1)
    assert [c.staleness for c in configs] == [0, bench_rl.ASYNC_STALENESS]
    assert figures["swap_s"] == pytest.approx(1.5)  # the relayed figure
    assert configs[1].workers == 1 and configs[0].steps == configs[1].steps
    # the base model and each run's last adapter, scored on the same held-out prompts
    assert SCORED[-1] == (["adapter-0.2.gguf", "adapter-0.3.gguf"], bench_rl.QUICK_EVAL_PROMPTS)
    assert (figures["heldout_base"], figures["heldout_trained_sync"],
            figures["heldout_trained_async"]) == (0.25, 0.5, 0.75)
    assert figures["heldout_ci95"] == pytest.approx(0.15)  # the widest of the three
    # the test of the run: each adapter more than 2 x 0.15 above the base's 0.25
    err = capsys.readouterr().err
    assert "trained (sync) - base = 0.250 vs 2 x ci95 = 0.300: NOT beyond" in err
    assert "trained (async) - base = 0.500 vs 2 x ci95 = 0.300: beats the base" in err
    assert "async - sync = 0.250 vs -ci95 = -0.150: no worse" in err


def test_a_machine_that_cannot_hold_the_rule_reports_no_busy_fraction(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # generation 40 s per group of 8 (r = 0.2/s) vs B / T = 8 / 1 s: 40 workers needed
    figures, configs = _run(monkeypatch, _report(1.0, 40.0, 90.0, 0.1), _report(1.0, 40.0, 60.0, 0.1))
    assert figures["busy_async"] is None
    assert configs[1].workers == bench_rl.MAX_WORKERS
    assert "cannot hold the capacity rule" in capsys.readouterr().err


def test_a_full_run_writes_the_reward_plot(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setattr(bench_rl, "PLOT_PATH", tmp_path / "reward.png")
    n = bench_rl.PLOT_MIN_STEPS
    monkeypatch.setattr("node.rl.learner.run_training",
                        lambda config, on_step=None: _report(10.0, 2.0, 30.0, 0.1, n=n))
    monkeypatch.setattr("node.bench.rl.swaps.relayed_swaps_of_run", _relayed)
    monkeypatch.setattr(bench_rl, "score_heldout", _scores)
    bench_rl.run(quick=False)
    assert (tmp_path / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_from_two_run_directories_splits_format_and_accuracy(tmp_path: Any) -> None:
    import json

    for name, rewards in (("sync", (0.0, 0.5, 1.5, 1.5)), ("async", (0.5, 0.5, 0.0, 0.0))):
        (tmp_path / name).mkdir()
        lines = [json.dumps({"version": v, "mean_reward": sum(rewards) / 4, "rewards": rewards,
                             "kl": 0.01 * v, "entropy": 1.0, "clip_fraction": 0.0,
                             "heldout_accuracy": 0.4 if v == 2 else None,
                             "heldout_half_width": 0.1 if v == 2 else None})
                 for v in range(1, 4)]
        (tmp_path / name / "steps.jsonl").write_text("\n".join(lines) + "\n")
    path = bench_rl.plot_runs(tmp_path / "sync", tmp_path / "async", tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads(path.with_suffix(".json").read_text())
    sync, asyn = record["synchronous (S = 0)"], record[f"asynchronous (S = {bench_rl.ASYNC_STALENESS})"]
    assert sync["format"] == [0.75] * 3 and sync["correct"] == [0.5] * 3
    assert asyn["format"] == [0.5] * 3 and asyn["correct"] == [0.0] * 3
    assert sync["heldout"] == [[2, 0.4, 0.1]] and sync["kl"] == [0.01, 0.02, 0.03]
    assert bench_rl.reward_parts(()) == (0.0, 0.0)
    assert bench_rl.reward_parts((1.0, 1.0, 0.5, 0.0)) == (0.25, 0.0)  # right but unformed
