"""The voting scenario's attacks, small: colluders (and colluders praising each other in the
ledger) against the protocol's rule, with the former rule measured in the same run."""

from __future__ import annotations

from typing import Any

from simulations.runner.run import run_scenario
from simulations.scenario import parse

HONEST = {"share": 0.7, "skill": 0.7, "calibration": 0.7}
WRONG = {"share": 0.15, "device": "rtx4090", "behaviour": "wrong"}


def attacked(seed: int) -> Any:
    return parse(
        {
            "kind": "voting",
            "seed": seed,
            "nodes": 22,
            "duration_s": 1200,
            "workload": {
                "requesters": 2,
                "tasks_per_min": 8,
                "deadline_s": 30,
                "questions": 200,
                "mixes": {
                    "adversarial": [HONEST, WRONG,
                                    {"share": 0.15, "device": "rtx4090", "behaviour": "colluder"}],
                    "sybil": [HONEST, WRONG,
                              {"share": 0.15, "device": "rtx4090", "behaviour": "sybil"}],
                },
            },
            "sweep": {"k": [3], "today_k": [3]},
        },
        "tiny",
        "tiny-voting-attacks",
    )


def test_both_rules_in_one_run_and_the_new_one_resists_both_attacks() -> None:
    report = run_scenario(attacked(1))[0]
    head = report.headline
    for name in ("colluders", "praising_colluders"):
        new, old = head[name], head[f"{name}_today"]
        assert set(new) == set(old) == {"weighted_k3", "majority_k3"}, name
        assert new["weighted_k3"] >= new["majority_k3"], (name, new)
        assert new["weighted_k3"] > old["weighted_k3"], (name, new, old)
    rules = sorted((r["mix"], r["k"], r["rule"]) for r in report.results["accuracy"])
    assert rules == [("adversarial", 3, "earned"), ("adversarial", 3, "today"),
                     ("sybil", 3, "earned"), ("sybil", 3, "today")]
    assert report.invariants["every_task_ended_exactly_once"]
