"""Commit/reveal across real daemons (separate processes, loopback, port 0): with
``[verify] enabled`` on every node, executors commit, the asker closes the window, reveals
come back through the verify service's routing, and the answer is voted as before; every
result shows its verification status in `symphony ask --json`. The solver here has no model
(so no fingerprints and nothing to re-check: require_fingerprints is off); the model checks
themselves are covered by tests/models/test_checks.py."""

from __future__ import annotations

import json

import pytest

from .conftest import CONVERGE_S, TASKS, Testnet, run_cli

pytestmark = pytest.mark.integration

SOLVER = "tests.node.arith_solver:factory"
VERIFY = {"enabled": True, "require_fingerprints": False, "verifier": False,
          "commit_window_ms": 5000}


def test_commit_reveal_across_daemons(testnet: Testnet) -> None:
    asker = testnet.start("asker", config={"tasks": TASKS, "verify": VERIFY})
    execs = [testnet.start(n, bootstrap=[asker], wait=False,
                           config={"executor": {"solver": SOLVER}, "verify": VERIFY})
             for n in ("e1", "e2")]
    for node in execs:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    shown = run_cli("ask", "What is 6 * 7?", "--k", "2", "--answer-type", "number", "--json",
                    "--deadline-ms", "40000", data_dir=asker.data_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    snap = json.loads(shown.stdout)
    assert snap["phase"] == "done" and snap["answer"] == "42", snap
    assert {r["executor"] for r in snap["results"]} == {e.peer_id for e in execs}
    assert {r["verification"] for r in snap["results"]} <= {"nothing_to_check", "not_sampled"}
    assert set(snap["verification"]) == {e.peer_id for e in execs}
    human = run_cli("tasks", "show", snap["task_id"], data_dir=asker.data_dir)
    assert human.returncode == 0 and "verified" in human.stdout


def test_layer_state_check_across_daemons(testnet: Testnet) -> None:
    """The real path end to end: two SmolLM2 executors that also verify, every result
    sampled; the verifier fetches the executor's layer-state leaves over the states stream
    (real libp2p between processes), re-runs layers, and its verdict reaches the asker."""
    verify = {"enabled": True, "sample_rate": 1.0, "verifiers": 1,
              "commit_window_ms": 20000}
    asker = testnet.start("asker", config={"tasks": TASKS, "verify": {**verify,
                                                                      "verifier": False}})
    execs = [testnet.start(n, bootstrap=[asker], wait=False,
                           config={"executor": {"solver": "models"}, "verify": verify})
             for n in ("e1", "e2")]
    for node in execs:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(lambda: all(e.status()["services"]["verify"]["verifier"] for e in execs),
                       "verifiers loaded", timeout_s=120)
    shown = run_cli("ask", "What is 6 * 7?", "--k", "1", "--answer-type", "number", "--json",
                    "--max-tokens", "48", "--deadline-ms", "120000", data_dir=asker.data_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    snap = json.loads(shown.stdout)
    assert snap["phase"] == "done", snap
    assert [r["verification"] for r in snap["results"]] == ["passed"], snap
    checked = [e for e in execs if e.log_events("verify.attest")]
    assert len(checked) == 1 and checked[0].peer_id != snap["results"][0]["executor"]
