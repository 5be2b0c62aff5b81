"""`symphony bench agents`: the report's figures from the asks' outcomes (accuracy, Wilson 95%
intervals, latencies, plan counts), the questions it asks, and its CLI wiring (options reach
its ``run``, ``--json`` prints its figures). The bench itself starts five daemons with models:
it is the measurement, run by hand, not here."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from models.stats import wilson_interval
from node.bench import BENCHMARKS, OPTIONS
from node.bench.agents import bench
from node.bench.agents.report import MODES, Outcome, PlanCounts, assemble, plan_counts
from node.cli.main import main

KEYS = {"questions", "accuracy_single", "accuracy_vote", "accuracy_plan",
        "accuracy_single_ci95", "accuracy_vote_ci95", "accuracy_plan_ci95",
        "latency_single_s", "latency_plan_s", "steps_rerouted", "plans_valid_fraction"}


def _outcomes(right: int, n: int, seconds: float) -> list[Outcome]:
    return [Outcome(i < right, seconds + i) for i in range(n)]


def test_accuracies_and_their_intervals_per_mode() -> None:
    outcomes = {"single": _outcomes(1, 6, 2.0), "vote": _outcomes(3, 6, 5.0),
                "plan": _outcomes(6, 6, 30.0)}
    figures = assemble(6, outcomes, PlanCounts(plans_valid=17, plans_invalid=1, steps=40,
                                               plans_with_steps=16, steps_rerouted=2))
    assert KEYS <= set(figures)
    assert figures["questions"] == 6
    assert figures["accuracy_single"] == round(1 / 6, 4)
    assert figures["accuracy_vote"] == 0.5 and figures["accuracy_plan"] == 1.0
    low, high = wilson_interval(3, 6)
    assert figures["accuracy_vote_ci95"] == [round(low, 4), round(high, 4)]
    # all right still leaves an interval below 1 with six questions
    plan_low, plan_high = figures["accuracy_plan_ci95"]  # type: ignore[misc]
    assert 0.5 < plan_low < 1.0 and plan_high == 1.0
    # medians of 2..7 s and 30..35 s
    assert figures["latency_single_s"] == 4.5 and figures["latency_plan_s"] == 32.5
    assert figures["plans_valid_fraction"] == round(17 / 18, 4)
    assert figures["steps_per_plan"] == 2.5 and figures["steps_rerouted"] == 2


def test_a_failed_ask_counts_as_wrong_and_not_done() -> None:
    rows = [Outcome(False, 600.0, done=False), Outcome(True, 10.0)]
    figures = assemble(2, {m: rows for m in MODES}, PlanCounts())
    assert figures["accuracy_single"] == 0.5 and figures["done_plan"] == 1
    assert figures["plans_valid_fraction"] == 0.0  # no planner answered: none parsed


def test_the_modes_must_see_the_same_questions() -> None:
    rows = _outcomes(1, 3, 1.0)
    with pytest.raises(ValueError, match="vote: 2 outcomes for 3 questions"):
        assemble(3, {"single": rows, "vote": rows[:2], "plan": rows}, PlanCounts())
    with pytest.raises(ValueError, match="expected"):
        assemble(3, {"single": rows, "vote": rows}, PlanCounts())
    with pytest.raises(ValueError, match="at least one question"):
        assemble(0, {m: [] for m in MODES}, PlanCounts())


def test_plan_counts_read_the_plan_snapshots() -> None:
    def step(agent: str) -> dict[str, Any]:
        return {"instruction": "x", "agent": agent, "executor": "p", "output": "1"}

    snaps: list[dict[str, object]] = [
        {"steps_rerouted": 1, "plans": [
            {"state": "answered", "steps": [step("calculator"), step("generalist")]},
            {"state": "failed", "steps": []}]},
        {"steps_rerouted": 0, "plans": [{"state": "answered", "steps": [step("calculator")]}]},
        {"phase": "refused", "failure": "no executors"},
    ]
    counts = plan_counts(snaps, "calculator")
    assert (counts.steps_rerouted, counts.steps, counts.steps_by_calculator,
            counts.plans_with_steps) == (1, 3, 2, 2)


def test_the_questions_are_the_plan_set_with_exact_answers() -> None:
    quick = bench._questions(bench.QUICK_QUESTIONS)
    assert len(quick) == bench.QUICK_QUESTIONS and len(bench._questions(None)) >= 40
    question, answer = quick[0]
    assert "boxes" in question and answer == "64"  # plan-000: 7 * 12 - 20
    assert bench._correct({"phase": "done", "answer": "64.0"}, "64")
    assert not bench._correct({"phase": "done", "answer": "63"}, "64")
    assert not bench._correct({"phase": "failed", "answer": "64"}, "64")


def test_the_cli_passes_model_and_seed_and_prints_the_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bool, dict[str, Any]]] = []

    def fake_run(quick: bool, **options: Any) -> dict[str, Any]:
        calls.append((quick, options))
        return assemble(1, {m: [Outcome(True, 1.0)] for m in MODES}, PlanCounts())

    assert BENCHMARKS["agents"] == "node.bench.agents.bench" and OPTIONS["agents"] == (
        "model", "seed")
    monkeypatch.setattr(bench, "run", fake_run)
    result = CliRunner().invoke(main, ["bench", "agents", "--quick", "--json",
                                       "--model", "/m/big.gguf", "--seed", "7"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert KEYS <= set(figures) and figures["accuracy_plan_ci95"][1] == 1.0
    assert calls == [(True, {"model": "/m/big.gguf", "seed": 7})]
    refused = CliRunner().invoke(main, ["bench", "agents", "--frames", "3"])
    assert refused.exit_code != 0 and "--frames applies only to: fuzz" in refused.output
    assert CliRunner().invoke(main, ["bench", "tasks", "--seed", "1"]).exit_code != 0
    assert calls == [(True, {"model": "/m/big.gguf", "seed": 7})]
