"""`symphony simulate plans`: the plan-quality model, the executors' arithmetic, the report's
keys, determinism, and figures that move with the model's rates."""

from __future__ import annotations

import functools
import json
import random

import pytest
from click.testing import CliRunner

import simulations.agents.plans as plans
from node.cli.simulate import simulate
from protocol.agents.plans import InvalidPlan, parse_plan
from simulations.agents.plans import (
    PlansConfig,
    evaluate,
    operations,
    plan_text,
    run_plans_scenario,
    step_answer,
)

KEYS = {"plans_valid_fraction", "steps_per_plan", "accuracy_plan", "accuracy_plan_ci95",
        "steps_rerouted", "replans", "latency_plan_s", "questions", "steps_to_calculator"}


def test_an_expression_becomes_its_operations_in_order() -> None:
    assert operations("7 * 12 - 20") == [("7", "*", "12"), ("[1]", "-", "20")]
    assert operations("8 * 6 + 6 * 4") == [("8", "*", "6"), ("6", "*", "4"),
                                           ("[1]", "+", "[2]")]
    assert evaluate("(12 + 4) // 2") == 8 and evaluate("__import__('os')") is None


def test_a_step_is_computed_from_the_earlier_steps_outputs() -> None:
    q = ("Task: x\nEarlier steps and their results:\n1. Compute 7 * 12 -> 84\n"
         "Your step (2 of 2): Compute [1] - 20")
    assert step_answer(q, True, 1.0, random.Random(1)) == "64"
    # a generalist that always errs is off
    assert step_answer(q, False, 1.0, random.Random(1)) != "64"
    assert step_answer("no step here", True, 0.0, random.Random(1)).startswith("I cannot")


def test_plan_texts_are_read_by_the_real_parser() -> None:
    rng = random.Random(4)
    cfg = PlansConfig(invalid_rate=0.3)
    valid = 0
    for _ in range(200):
        try:
            plan = parse_plan(plan_text("7 * 12 - 20", cfg, rng))
        except InvalidPlan:
            continue
        valid += 1
        assert 1 <= len(plan.steps) <= 2
    assert 0.6 < valid / 200 < 0.8


def test_the_report_has_its_keys_and_is_deterministic() -> None:
    first = run_plans_scenario(3, 5)
    assert KEYS <= first.keys() and first["questions"] == 5
    assert 0.0 <= first["plans_valid_fraction"] <= 1.0 and first["steps_per_plan"] >= 1.0
    assert run_plans_scenario(3, 5) == first
    assert run_plans_scenario(4, 5) != first


def test_figures_follow_the_model() -> None:
    good = run_plans_scenario(1, 6, invalid_rate=0.0)
    assert good["plans_valid_fraction"] == 1.0 and good["steps_to_calculator"] == 1.0
    bad = run_plans_scenario(1, 6, invalid_rate=0.6)
    assert bad["plans_valid_fraction"] < 0.7 and bad["replans"] > good["replans"]
    # no calculator: generalists answer every step, with errors
    alone = run_plans_scenario(1, 6, calculators=0, generalist_error=0.5)
    assert alone["steps_to_calculator"] == 0.0 and alone["accuracy_plan"] < good["accuracy_plan"]


def test_the_cli_prints_the_report_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plans, "run_plans_scenario",
                        functools.partial(run_plans_scenario, questions=3))
    result = CliRunner().invoke(simulate, ["plans", "--seed", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert KEYS <= report.keys() and report["seed"] == 2 and report["questions"] == 3
