"""Tiny scenarios shared by the scenario tests and the sweep-point tests: runs of tens of
nodes and minutes of virtual time, so a test that runs one stays fast."""

from __future__ import annotations

from typing import Any

from simulations.scenario import parse


def tiny_ledger(seed: int = 1) -> Any:
    return parse(
        {
            "kind": "ledger",
            "seed": seed,
            "workload": {
                "advertisers": 4,
                "warmup_s": 10,
                "updates": 3,
                "update_interval_s": 5,
                "anti_entropy_s": 10,
                "sample_s": 5,
                "settle_s": 10,
            },
            "sweep": {"nodes": [20, 40], "churn_nodes": 20, "churn_crash_per_min": [0.2]},
        },
        "tiny",
        "tiny-ledger",
    )
