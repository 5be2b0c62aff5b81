"""Scenarios end to end: loading, determinism of report.json, conservation invariants, report
and CLI. Every run is tiny (tens of nodes, minutes of virtual time) so the file stays fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from simulations.runner.report import report_hash, write
from simulations.runner.run import run_scenario
from simulations.scenario import SCENARIO_DIR, ScenarioError, load, parse
from tests.simulations.tiny_scenarios import tiny_ledger

SHIPPED = ("ledger", "voting", "routing", "verification", "relay", "membership", "distributed",
           "rl")


def tiny_voting(seed: int) -> Any:
    return parse(
        {
            "kind": "voting",
            "seed": seed,
            "nodes": 10,
            "duration_s": 120,
            "workload": {
                "requesters": 2,
                "tasks_per_min": 10,
                "deadline_s": 30,
                "questions": 50,
                "mixes": {
                    "mixed": [
                        {"share": 0.75, "skill": 0.8},
                        {"share": 0.25, "behaviour": "colluder"},
                    ]
                },
            },
            "sweep": {"k": [1, 3]},
        },
        "tiny",
        "tiny-voting",
    )


def tiny_verification(seed: int) -> Any:
    return parse(
        {
            "kind": "verification",
            "seed": seed,
            "nodes": 9,
            "duration_s": 180,
            "workload": {
                "requesters": 1,
                "tasks_per_min": 10,
                "deadline_s": 60,
                "k": 2,
                "lazy_verifier_share": 0.0,
            },
            "sweep": {"sample_rate": [1.0], "cheater_share": [0.5]},
        },
        "tiny",
        "tiny-verification",
    )


def tiny_relay(seed: int) -> Any:
    return parse(
        {
            "kind": "relay",
            "seed": seed,
            "workload": {"size_mib": 32, "link_mbps": 100, "chunk_mib": 1, "free_rider_share": 0.2},
            "sweep": {
                "nodes": [6],
                "topologies": ["chain", "plan"],
                "chunk_mib": [2],
                "chunk_nodes": 6,
            },
        },
        "tiny",
        "tiny-relay",
    )


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_load(name: str) -> None:
    scenario = load(name)
    assert scenario.kind == name and (SCENARIO_DIR / f"{name}.toml").exists()


def test_unknown_keys_and_missing_kind_are_errors_that_name_the_key() -> None:
    with pytest.raises(ScenarioError, match="'nodez'"):
        parse({"kind": "ledger", "nodez": 3}, "x.toml", "x")
    with pytest.raises(ScenarioError, match="'lossy'"):
        parse({"kind": "ledger", "network": {"lossy": 0.1}}, "x.toml", "x")
    with pytest.raises(ScenarioError, match="kind"):
        parse({"seed": 1}, "x.toml", "x")
    with pytest.raises(ScenarioError, match="no scenario"):
        load("no-such-scenario")


def test_same_seed_same_report_other_seed_other_report() -> None:
    first = run_scenario(tiny_ledger(1))[0].to_json()
    again = run_scenario(tiny_ledger(1))[0].to_json()
    other = run_scenario(tiny_ledger(2))[0].to_json()
    assert report_hash(first) == report_hash(again), "seed 1 is not reproducible"
    assert report_hash(first) != report_hash(other), "the seed does not change the run"
    report = json.loads(first)
    assert report["invariants"]["every_update_reached_every_steady_node_without_churn"] is True


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_task_ends_exactly_once(seed: int) -> None:
    report = run_scenario(tiny_voting(seed))[0]
    inv = report.invariants
    assert inv["every_task_ended_exactly_once"], f"seed {seed}: {inv}"
    assert inv["tasks_never_ended"] == 0
    rows = report.results["accuracy"]
    assert all(r["tasks"] > 5 for r in rows), f"seed {seed}: too few tasks to mean anything"


@pytest.mark.parametrize("seed", [1, 2])
def test_no_chunk_is_delivered_that_was_never_published(seed: int) -> None:
    report = run_scenario(tiny_relay(seed))[0]
    inv = report.invariants
    assert inv["no_chunk_delivered_that_was_never_published"], f"seed {seed}"
    assert inv["no_chunk_served_that_was_not_held"], f"seed {seed}"
    assert inv["every_honest_peer_completed"], f"seed {seed}: {report.results['runs']}"
    chain = next(
        r for r in report.results["runs"] if r["topology"] == "chain" and r["chunk_mib"] == 1
    )
    # a pipelined chain of 6 takes about S/B plus a few chunk times, far below 6 * S/B
    assert 1.0 <= chain["ratio_vs_s_over_b"] < 2.0


def test_report_files_and_html_plots(tmp_path: Path) -> None:
    report, wall_s = run_scenario(tiny_relay(1))
    json_path, html_path = write(report, tmp_path, wall_s=wall_s)
    assert json.loads(json_path.read_text())["question"]
    page = html_path.read_text()
    assert "<h1>" in page and "Headline" in page
    pytest.importorskip("matplotlib")
    assert "data:image/png;base64," in page


def test_cli_simulate_writes_a_report(tmp_path: Path) -> None:
    from node.cli.main import main

    scenario = tmp_path / "mini.toml"
    scenario.write_text(
        'kind = "relay"\nseed = 3\n[workload]\nsize_mib = 4\nchunk_mib = 1\nfree_rider_share = 0.0\n'
        '[sweep]\nnodes = [4]\ntopologies = ["chain"]\nchunk_mib = [1]\n'
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["simulate", str(scenario), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["largest_n"] == 4
    assert (out / "report.json").exists() and (out / "report.html").exists()
    bad = CliRunner().invoke(main, ["simulate", "no-such-scenario"])
    assert bad.exit_code != 0 and "no scenario" in bad.output


@pytest.mark.parametrize("seed", [1, 2])
def test_honest_executors_are_never_convicted_and_cheaters_are(seed: int) -> None:
    report = run_scenario(tiny_verification(seed))[0]
    assert report.invariants["no_honest_executor_convicted"], f"seed {seed}"
    assert report.invariants["every_task_ended_exactly_once"], f"seed {seed}"
    row = report.results["runs"][0]
    # p = 1: every result is checked, so every cheater that answered anything is convicted
    assert row["convicted"] >= 1, f"seed {seed}: {row}"
    assert 0 < row["verify_cost_ratio"] < 0.1, f"seed {seed}: {row}"
