"""The task market across real daemons (separate processes, loopback, port 0): one node asks,
three execute with a deterministic test solver (tests/node/arith_solver.py), and the answer
comes back voted; an executor killed mid-task is replaced from the spare bid; a node with no
configuration serves the embedded default model, advertises it (with its quantization) in
its ledger record and answers through the network."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from models.device import cpu_name, ram_bytes
from node.api.token import read_token

from .arith_solver import DELAY_ENV
from .conftest import (
    ARITH_SOLVER,
    CONVERGE_S,
    FAST_MEMBERSHIP,
    TASKS,
    TEST_NETWORK_ID,
    Testnet,
    run_cli,
)

pytestmark = pytest.mark.integration



def start(testnet: Testnet, delay_ms: int = 50, hold_ms: int = 5000) -> list[Any]:
    asker = testnet.start("asker", config={"tasks": TASKS})
    env = {DELAY_ENV: str(delay_ms)}
    execs = [testnet.start(n, bootstrap=[asker], wait=False, env=env,
                           config={"executor": {"solver": ARITH_SOLVER, "hold_ms": hold_ms}})
             for n in ("e1", "e2", "e3")]
    for node in execs:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    return [asker, *execs]


def test_one_asks_three_execute_and_vote(testnet: Testnet) -> None:
    asker, *execs = start(testnet)
    shown = run_cli("ask", "What is 6 * 7?", "--k", "3", "--answer-type", "number", "--json",
                    "--deadline-ms", "40000", data_dir=asker.data_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    snap = json.loads(shown.stdout)
    assert snap["phase"] == "done" and snap["answer"] == "42" and not snap["partial"]
    assert snap["votes"][0]["count"] == 3
    assert {r["executor"] for r in snap["results"]} == {e.peer_id for e in execs}
    assert all("Final answer: 42" in r["cot"] for r in snap["results"])
    # stored, listed and shown by the CLI and the API
    listed = run_cli("tasks", "list", "--json", data_dir=asker.data_dir)
    assert json.loads(listed.stdout)[0]["task_id"] == snap["task_id"]
    human = run_cli("tasks", "show", snap["task_id"], data_dir=asker.data_dir)
    assert human.returncode == 0 and "42" in human.stdout
    # the OpenAI-compatible route, with the API token as the key
    token = read_token(asker.data_dir)
    reply = httpx.post(f"{asker.api_url}/v1/chat/completions", timeout=60,
                       headers={"Authorization": f"Bearer {token}"},
                       json={"model": "auto", "messages": [{"role": "user",
                                                           "content": "What is 5 + 4?"}]})
    assert reply.status_code == 200, reply.text
    # one executor by default: its whole reply is the content
    assert reply.json()["choices"][0]["message"]["content"].endswith("Final answer: 9")
    assert httpx.post(f"{asker.api_url}/v1/chat/completions", json={}).status_code == 401
    models = httpx.get(f"{asker.api_url}/v1/models", timeout=10,
                       headers={"Authorization": f"Bearer {token}"}).json()
    assert models["object"] == "list"


def test_killed_executor_is_replaced_and_the_task_completes(testnet: Testnet) -> None:
    asker, *execs = start(testnet, delay_ms=6000, hold_ms=20000)
    token = read_token(asker.data_dir)
    made = httpx.post(f"{asker.api_url}/tasks/", timeout=10,
                      headers={"Authorization": f"Bearer {token}"},
                      json={"question": "What is 12 * 3?", "answer_type": "number", "k": 2,
                            "deadline_ms": 60000, "wait": False})
    assert made.status_code == 202, made.text
    task_id = made.json()["task_id"]

    def computing() -> Any:
        for node in execs:
            running = node.status()["services"]["executor"]["running"]
            if any(j["task_id"] == task_id for j in running):
                return node
        return None

    victim = testnet.wait_until(computing, "an executor to start computing", CONVERGE_S)
    victim.kill()

    def finished() -> Any:
        snap = httpx.get(f"{asker.api_url}/tasks/{task_id}", timeout=10).json()
        return snap if snap["phase"] in ("done", "failed") else None

    snap = testnet.wait_until(finished, "the task to finish", 60)
    assert snap["phase"] == "done" and snap["answer"] == "36" and not snap["partial"]
    assert victim.peer_id not in {r["executor"] for r in snap["results"]}
    assert any(a["peer"] == victim.peer_id and a["state"] == "failed"
               for a in snap["attempts"])


def test_a_plain_node_serves_the_default_model_and_answers(testnet: Testnet,
                                                           tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    # a real model on a shared machine: generous time per attempt, so load cannot fail it
    asker = testnet.start("asker", config={"tasks": {**TASKS, "assign_base_ms": 60_000}})
    # a node with no [executor] config at all (the fixture's testnet opts out of the model)
    plain = Testnet(tmp_path / "plain", network_id=TEST_NETWORK_ID, config=FAST_MEMBERSHIP)
    try:
        node = plain.start("plain", bootstrap=[asker], timeout_s=120)
        testnet.wait_until(lambda: asker.ready_peers() == {node.peer_id}, "the two to meet",
                           CONVERGE_S)
        (model,) = node.status()["services"]["executor"]["models"]
        assert (model["name"], model["quantization"]) == ("smollm2-135m-instruct-q4_1", "Q4_1")

        def advertised() -> Any:  # the plain node's capability record, as the asker holds it
            got = httpx.get(f"{asker.api_url}/ledger/peers/{node.peer_id}", timeout=10)
            record = got.json().get("record") if got.status_code == 200 else None
            return record if record and record["models"] else None

        record = testnet.wait_until(advertised, "the model in the ledger record", CONVERGE_S)
        assert record["models"][0]["quantization"] == "Q4_1"
        # the device the model runs on: this machine's CPU (llama.cpp here does not offload)
        assert record["hardware"] == {"device_kind": "cpu", "device_name": cpu_name(),
                                      "memory_bytes": ram_bytes(), "cpu_cores": os.cpu_count()}
        shown = run_cli("ask", "What is 6 * 7?", "--k", "1", "--answer-type", "number",
                        "--max-tokens", "16", "--json", data_dir=asker.data_dir, timeout_s=180)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        (result,) = json.loads(shown.stdout)["results"]
        assert result["executor"] == node.peer_id and result["tokens"] > 0
        assert result["model_hash"] == model["model_hash"]
    finally:
        plain.kill_all()
