"""Agent cards across real daemons (separate processes, loopback, port 0), with the real text
embedder: B declares an ``[[agents]]`` card; it reaches A, whose ``GET /agents`` and
``symphony agents list`` show it with its vector verified (A re-embedded B's description);
after a restart A still holds it. A daemon whose agent names a model it does not serve does
not start, and says which model.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import node.testnet as local
from node.testnet import NodeProcess

from .conftest import ARITH_SOLVER, Testnet, run_cli

pytestmark = pytest.mark.integration

#: bound on every wait below: both daemons load the embedder (seconds of CPU each) first
CONVERGE_S = 90.0
CALC = {
    "name": "calc",
    "description": "Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly.",
    "skills": ["arithmetic", "math"],
    "tools": ["calculator"],
}
EMBED = {"ledger": {"agent_embeddings": True, "anti_entropy_ms": 1000,
                    "capability_poll_ms": 200}}


def _agents(node: NodeProcess) -> list[dict[str, Any]]:
    response = httpx.get(node.api_url + "/agents", timeout=5.0)
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["agents"]
    return result


def _verified(node: NodeProcess, peer: str) -> list[dict[str, Any]]:
    return [a for a in _agents(node) if a["peer_id"] == peer and a["vector_verified"]]


def test_a_nodes_agent_card_reaches_another_verified(testnet: Testnet) -> None:
    a = testnet.start("a", config=EMBED)
    b = testnet.start("b", bootstrap=[a], config={
        **EMBED, "executor": {"solver": ARITH_SOLVER}, "agents": [CALC]})
    testnet.wait_all_connected()
    testnet.wait_until(lambda: _verified(a, b.peer_id), "b's card verified on a", CONVERGE_S)
    (card,) = _verified(a, b.peer_id)
    assert card["name"] == "calc" and card["skills"] == ["arithmetic", "math"]
    assert card["tools"] == [{"name": "calculator", "side_effects": False,
                              "description": card["tools"][0]["description"]}]
    assert card["model"] == "test-arith" and card["has_vector"] and not card["self"]
    assert len(card["embedder_hash"]) == 64
    assert [x["name"] for x in _agents(a)] == ["calc"]  # a serves no model: it hosts none
    (own,) = _agents(b)
    assert own["self"] and own["vector_verified"]

    shown = run_cli("agents", "list", "--json", data_dir=a.data_dir)
    assert shown.returncode == 0, shown.stderr
    assert [x["name"] for x in json.loads(shown.stdout)["agents"]] == ["calc"]
    table = run_cli("agents", "list", data_dir=a.data_dir)
    assert table.returncode == 0 and "calc" in table.stdout and "verified" in table.stdout
    status = a.status()["services"]["ledger"]
    assert status["agents"]["refused"] == 0 and status["agent_records"] == 1

    a.kill()
    a.restart()
    (restored,) = a.log_events("ledger.restored")[-1:]
    assert restored["agents"] == 1
    testnet.wait_until(lambda: _verified(a, b.peer_id), "b's card checked again on a",
                       CONVERGE_S)
    for node in (a, b):
        assert not node.log_events("driver.machine_error"), node.log_tail()
        assert not node.log_events("driver.perform_error"), node.log_tail()


def test_an_agent_on_a_model_the_node_does_not_serve_stops_the_start(testnet: Testnet) -> None:
    with pytest.raises(local.TestnetError, match="'nope' is not a model this node serves"):
        testnet.start("c", config={"executor": {"solver": ARITH_SOLVER},
                                   "agents": [{**CALC, "model": "nope"}]})
