"""Membership at small scale with the real machine: joins reach their target, the overlay is
one piece without churn, discovery traffic is counted, and a seed gives one report."""

from __future__ import annotations

from typing import Any

import pytest

from simulations.runner.report import report_hash
from simulations.runner.run import run_scenario
from simulations.scenario import ScenarioError, load, parse

TARGET = 6


def tiny_membership(seed: int, nodes: int = 200, churn_s: float = 40, **churn: float) -> Any:
    return parse(
        {
            "kind": "membership",
            "seed": seed,
            "nodes": nodes,
            "network": {"latency": {"kind": "lognormal", "a": 40.0, "b": 0.5, "jitter_ms": 5.0}},
            "churn": {"restart_after_s": 20, **churn},
            "workload": {
                "bootstrap_nodes": 4,
                "bootstrap_per_node": 2,
                "target_peers": TARGET,
                "join_s": 20,
                "settle_s": 30,
                "churn_s": churn_s,
                "sample_s": 5,
            },
        },
        "tiny",
        "tiny-membership",
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_every_joined_node_reaches_its_target_in_one_component(seed: int) -> None:
    report = run_scenario(tiny_membership(seed, churn_s=10))[0]
    joins = report.results["join_times"][0]
    assert joins["phase"] == "join"
    assert joins["reached_target"] == 200 - 4 and joins["never_reached"] == 0, f"seed {seed}"
    assert 0 < joins["p50_s"] <= joins["max_s"] < 20, f"seed {seed}: {joins}"
    overlay = report.results["overlay"]
    assert overlay["components_at_end_of_settle"] == 1, f"seed {seed}"
    assert overlay["components_max_under_churn"] == 1, f"seed {seed}: no churn configured"
    assert overlay["degree_min"] >= TARGET, f"seed {seed}: {overlay}"
    assert all(report.invariants.values()), f"seed {seed}: {report.invariants}"
    join, settle, _ = report.results["traffic_by_phase"]
    # joining costs dials and Hellos; a settled overlay pings and exchanges peers
    assert join["dials_per_node_per_min"] > settle["dials_per_node_per_min"]
    assert settle["exchange_bytes_per_node_per_min"] > 0
    assert settle["keepalive_bytes_per_node_per_min"] > 0


def test_churned_nodes_rejoin_and_the_same_seed_gives_the_same_report() -> None:
    churn = {"crash_per_min": 0.1, "leave_per_min": 0.05, "join_per_min": 0.05}
    first = run_scenario(tiny_membership(3, 100, **churn))[0]
    again = run_scenario(tiny_membership(3, 100, **churn))[0]
    other = run_scenario(tiny_membership(4, 100, **churn))[0]
    assert report_hash(first.to_json()) == report_hash(again.to_json()), "seed 3"
    assert report_hash(first.to_json()) != report_hash(other.to_json())
    summary = first.results["churn"]
    assert summary["crashes"] > 0 and summary["joins"] > 0
    rejoined = first.results["join_times"][1]
    assert rejoined["phase"] == "churn" and rejoined["reached_target"] > 0


def test_the_shipped_scenario_loads_and_bad_seed_counts_are_named() -> None:
    assert load("membership").kind == "membership"
    bad = parse({"kind": "membership", "nodes": 3, "workload": {"bootstrap_nodes": 4}}, "x", "x")
    with pytest.raises(ScenarioError, match="bootstrap_nodes"):
        run_scenario(bad)
