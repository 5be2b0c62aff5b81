"""Plan mode across real daemons (separate processes, loopback, port 0), with no
``[[agents]]`` configured: every node hosts the default generalist, whose ``planning`` skill
makes it a planner. With the real default model (SmolLM2-135M, plans under the JSON-schema
grammar) ``symphony ask --mode plan --json`` returns the plans and their steps; with the
deterministic test solver, a step's executor killed mid-step is replaced by another agent
and the task completes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from node.api.token import read_token

from .arith_solver import DELAY_ENV
from .conftest import ARITH_SOLVER, CONVERGE_S, TASKS, Testnet, run_cli

pytestmark = pytest.mark.integration

#: a real model on a shared machine: generous time per attempt, so load cannot fail it
MODEL_TASKS = {**TASKS, "assign_base_ms": 120_000, "plan_tokens": 200}


def test_plan_mode_on_the_default_model_returns_plans_and_steps(testnet: Testnet) -> None:
    pytest.importorskip("llama_cpp")
    asker = testnet.start("asker", config={"tasks": MODEL_TASKS})
    execs = [testnet.start(n, bootstrap=[asker], wait=False, timeout_s=180,
                           config={"executor": {"solver": "models"}})
             for n in ("e1", "e2", "e3")]
    for node in execs:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    shown = run_cli("ask", "Tom has 3 apples and buys 4 more. How many apples does he have?",
                    "--mode", "plan", "--answer-type", "number", "--max-tokens", "24",
                    "--deadline-ms", "600000", "--json", data_dir=asker.data_dir,
                    timeout_s=660)
    assert shown.returncode in (0, 1), shown.stdout + shown.stderr
    snap = json.loads(shown.stdout)
    assert snap["mode"] == "plan" and snap["phase"] == "done", snap.get("failure")
    assert "answer" in snap and snap["votes"]
    answered = [p for p in snap["plans"] if p["state"] == "answered"]
    assert len(answered) >= 2, snap["plans"]
    own = {e.peer_id for e in execs}
    for plan in answered:
        assert plan["planner"] in own and plan["steps"]
        for step in plan["steps"]:
            assert set(step) >= {"instruction", "requirement", "agent", "executor", "output"}
            assert step["executor"] in own and step["agent"] == "generalist"
    human = run_cli("tasks", "show", snap["task_id"], data_dir=asker.data_dir)
    assert human.returncode == 0 and "plan 1 by" in human.stdout and "step 1:" in human.stdout
    for node in (asker, *execs):
        assert not node.log_events("driver.machine_error"), node.log_tail()
        assert not node.log_events("driver.perform_error"), node.log_tail()


def test_a_killed_step_executor_is_replaced_and_the_plan_task_completes(
        testnet: Testnet) -> None:
    asker = testnet.start("asker", config={"tasks": TASKS})
    env = {DELAY_ENV: "5000"}
    execs = [testnet.start(n, bootstrap=[asker], wait=False, env=env,
                           config={"executor": {"solver": ARITH_SOLVER, "hold_ms": 20000}})
             for n in ("e1", "e2", "e3", "e4")]
    for node in execs:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    token = read_token(asker.data_dir)
    made = httpx.post(f"{asker.api_url}/tasks/", timeout=10,
                      headers={"Authorization": f"Bearer {token}"},
                      json={"question": "What is 12 * 3?", "answer_type": "number",
                            "mode": "plan", "planners": 2, "deadline_ms": 120000,
                            "wait": False})
    assert made.status_code == 202, made.text
    task_id = made.json()["task_id"]

    def plan() -> dict[str, Any]:
        got: dict[str, Any] = httpx.get(f"{asker.api_url}/tasks/{task_id}", timeout=10).json()
        return got

    def step_running() -> Any:  # an executor computing a plan's step (not its plan)
        steps = {s["task_id"] for p in plan()["plans"] for s in p["steps"] if s["task_id"]}
        for node in execs:
            running = node.status()["services"]["executor"]["running"]
            if any(j["task_id"] in steps for j in running):
                return node
        return None

    victim = testnet.wait_until(step_running, "an executor to compute a step", CONVERGE_S)
    victim.kill()
    snap = testnet.wait_until(lambda: (p := plan())["phase"] != "running" and p, "the plans",
                              90)
    assert snap["phase"] == "done" and snap["answer"] == "36", snap
    steps = [s for p in snap["plans"] for s in p["steps"]]
    assert all(s["executor"] and s["executor"] != victim.peer_id for s in steps)
    assert snap["steps_rerouted"] >= 1
    assert any(s["peers_tried"] >= 2 for s in steps)


def test_every_step_of_a_plan_is_verified_like_a_task(testnet: Testnet) -> None:
    """With ``[verify]`` on and every result sampled, the planner's and each step's results
    go through commit/reveal and another node's layer-state check, as a task's do: each
    child task shows its result verified."""
    pytest.importorskip("llama_cpp")
    # checks on a shared machine: a verifier's re-run gets time, so load cannot fail it
    verify = {"enabled": True, "sample_rate": 1.0, "verifiers": 1, "commit_window_ms": 20000,
              "check_timeout_ms": 240_000}
    asker = testnet.start("asker", config={"tasks": MODEL_TASKS,
                                           "verify": {**verify, "verifier": False}})
    execs = [testnet.start(n, bootstrap=[asker], wait=False, timeout_s=180,
                           config={"executor": {"solver": "models"}, "verify": verify})
             for n in ("e1", "e2")]
    for node in execs:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    testnet.wait_until(lambda: all(e.status()["services"]["verify"]["verifier"] for e in execs),
                       "verifiers loaded", timeout_s=120)
    shown = run_cli("ask", "What is 6 * 7?", "--mode", "plan", "--planners", "1",
                    "--answer-type", "number", "--max-tokens", "24", "--deadline-ms", "600000",
                    "--json", data_dir=asker.data_dir, timeout_s=660)
    snap = json.loads(shown.stdout)
    assert snap["phase"] == "done", snap
    (plan,) = [p for p in snap["plans"] if p["state"] == "answered"]
    children = [plan["planner_task"], *(s["task_id"] for s in plan["steps"])]

    def verified() -> Any:
        rows = [httpx.get(f"{asker.api_url}/tasks/{c}", timeout=10).json()["results"]
                for c in children]
        states = [r["verification"] for rs in rows for r in rs]
        return states if all(s == "passed" for s in states) else None

    states = testnet.wait_until(verified, "every child's result verified", 120)
    assert len(states) == len(children)
