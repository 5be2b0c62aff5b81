"""Agents in the task market across real daemons (separate processes, loopback, port 0), on
the real SmolLM2 and the real text embedder: B hosts the agent ``calc`` with the calculator,
C the default generalist, A asks. ``--needs "exact arithmetic"`` routes the task to B's calc
agent (A matched each bid from the bidder's card in its own ledger), whose result carries its
calculator call and the answer 7006652; the result is verified by C (commit/reveal, layer
states) like any other. The same question without a need goes by the model rule (match 0.5
for any model), whichever executor wins.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from node.testnet import NodeProcess

from .conftest import Testnet, run_cli

pytestmark = pytest.mark.integration

#: bound on every wait: each daemon loads SmolLM2, B and A the embedder, on shared cores
CONVERGE_S = 180.0
CALC = {
    "name": "calc",
    "description": "Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly.",
    "skills": ["arithmetic", "math"],
    "tools": ["calculator"],
}
LEDGER = {"agent_embeddings": True, "anti_entropy_ms": 1000, "capability_poll_ms": 200}
TASKS = {"bid_window_ms": 3000, "max_rounds": 8, "min_round_ms": 500}
VERIFY = {"enabled": True, "sample_rate": 1.0, "verifiers": 1, "commit_window_ms": 20000}
QUESTION = "What is 1234 * 5678?"


def _agents(node: NodeProcess) -> list[dict[str, Any]]:
    response = httpx.get(node.api_url + "/agents", timeout=5.0)
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["agents"]
    return result


def _ask(asker: NodeProcess, *extra: str) -> dict[str, Any]:
    shown = run_cli("ask", QUESTION, "--k", "1", "--answer-type", "number", "--json",
                    "--deadline-ms", "150000", *extra, data_dir=asker.data_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    snap: dict[str, Any] = json.loads(shown.stdout)
    return snap


def test_a_need_routes_to_the_calc_agent_and_its_tool_call_is_in_the_result(
        testnet: Testnet) -> None:
    a = testnet.start("a", config={"ledger": LEDGER, "tasks": TASKS,
                                   "verify": {**VERIFY, "verifier": False}})
    b = testnet.start("b", bootstrap=[a], wait=False, config={
        "ledger": LEDGER, "verify": VERIFY, "executor": {"solver": "models"}, "agents": [CALC]})
    c = testnet.start("c", bootstrap=[a], wait=False, config={
        "ledger": LEDGER, "verify": VERIFY, "executor": {"solver": "models"}})
    for node in (b, c):
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(lambda: {(x["peer_id"], x["name"]) for x in _agents(a)
                                if x["vector_verified"]} >= {(b.peer_id, "calc"),
                                                             (c.peer_id, "generalist")},
                       "both nodes' cards verified on a", CONVERGE_S)
    testnet.wait_until(lambda: all(n.status()["services"]["verify"]["verifier"] for n in (b, c)),
                       "verifiers loaded", CONVERGE_S)

    snap = _ask(a, "--needs", "exact arithmetic")
    assert snap["phase"] == "done", snap
    assert snap["agent"] == "calc" and snap["executor"] == b.peer_id, snap
    assert snap["answer"] == "7006652", snap
    assert [call["name"] for call in snap["tool_calls"]][:1] == ["calculator"], snap
    assert snap["tool_calls"][0]["output"] == "7006652"
    (result,) = snap["results"]
    assert result["verification"] == "passed", snap  # C re-ran B's agent answer
    (attempt,) = snap["attempts"]
    assert attempt["agent"] == "calc" and attempt["match_score"] > 0.5
    shown = run_cli("tasks", "show", snap["task_id"], data_dir=a.data_dir)
    assert shown.returncode == 0 and "calc" in shown.stdout and "calculator" in shown.stdout

    plain = _ask(a)  # no need: the model rule, every bid matches 0.5
    assert plain["phase"] == "done", plain
    (attempt,) = plain["attempts"]
    assert attempt["match_score"] == 0.5
    assert (plain["executor"], plain["agent"]) in {(b.peer_id, "calc"),
                                                   (c.peer_id, "generalist")}
    for node in (a, b, c):
        assert not node.log_events("driver.machine_error"), node.log_tail()
        assert not node.log_events("driver.perform_error"), node.log_tail()
