"""``[compute] backend = "models"``: the voting workload on the real model.

The key is validated like every scenario key (a bad value is named); a tiny run on the
embedded SmolLM2 is reproducible per seed (salts and sampling seeds come from the scenario
seed, compute time from generated tokens) and ends every task.
"""

from __future__ import annotations

from typing import Any

import pytest

from simulations.runner.report import report_hash
from simulations.runner.run import run_scenario
from simulations.scenario import ScenarioError, load, parse


@pytest.mark.parametrize(
    ("compute", "named"),
    [
        ({"backend": "gpu"}, "'gpu'"),
        ({"backend": "models", "time": "wallclock"}, "'wallclock'"),
        ({"backend": "models", "max_tokens": 0}, "max_tokens"),
        ({"backend": "models", "max_tokens": "many"}, "'many'"),
        ({"backend": "models", "temperature": -1.0}, "temperature"),
        ({"backend": "models", "threads": True}, "threads"),
        ({"backend": "models", "modle": "x"}, "'modle'"),
        ({"model": "smollm2"}, "model"),  # a models-only key with the cost model
    ],
)
def test_a_bad_compute_value_is_refused_naming_it(compute: dict[str, Any], named: str) -> None:
    with pytest.raises(ScenarioError, match=r"\[compute\]") as err:
        parse({"kind": "voting", "compute": compute}, "x.toml", "x")
    assert named in str(err.value)


def test_the_cost_model_stays_the_default_and_models_serves_market_workloads_only() -> None:
    assert parse({"kind": "voting"}, "x.toml", "x").compute.backend == "cost"
    ledger = parse({"kind": "ledger", "compute": {"backend": "models"}}, "x.toml", "x")
    with pytest.raises(ScenarioError, match="serves only"):
        run_scenario(ledger)  # refused before any model is loaded


def test_the_shipped_real_scenario_asks_the_real_model() -> None:
    scenario = load("voting-real")
    assert scenario.kind == "voting" and scenario.compute.real
    assert scenario.compute.time == "tokens"  # reproducible


def tiny_real_voting(seed: int) -> Any:
    return parse(
        {
            "kind": "voting",
            "seed": seed,
            "nodes": 4,
            "duration_s": 40,
            "network": {"degree": 3},
            "compute": {"backend": "models", "max_tokens": 48, "temperature": 0.7},
            "workload": {
                "requesters": 1,
                "tasks_per_min": 10,
                "deadline_s": 30,
                "mixes": {"cpu": [{"share": 1.0, "device": "cpu"}]},
            },
            "sweep": {"k": [2]},
        },
        "tiny",
        "tiny-real-voting",
    )


@pytest.mark.integration
def test_a_real_model_run_is_reproducible_and_ends_every_task() -> None:
    first = run_scenario(tiny_real_voting(1))[0]
    again = run_scenario(tiny_real_voting(1))[0]
    assert report_hash(first.to_json()) == report_hash(again.to_json()), "seed 1 differs"
    assert first.invariants["every_task_ended_exactly_once"] is True
    assert first.invariants["tasks_never_ended"] == 0
    (row,) = first.results["accuracy"]
    assert 2 <= row["tasks"] <= 6, row
    assert first.results["real_model"]["solves"] >= 2 * row["tasks"]
