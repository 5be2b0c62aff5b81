"""An agent whose tools come from an MCP server, asked through the market across real daemons
(separate processes, loopback, port 0): A asks, B hosts the agents on the real SmolLM2 (its
tool steps run under llama.cpp's JSON-schema grammar) with three servers of
tests/node/mcp_tool_server.py, each given its own folder:

* ``notes`` and ``vault`` are the same server code, each with the side-effecting ``stamp``
  (it writes ``stamp.txt`` in its folder). B's ``[tools]`` table allows ``notes.stamp`` for A
  and ``vault.stamp`` for another peer only. Agent ``stamper`` (tool ``notes.stamp``) runs
  it for A: the file is written, the result's call says "stamped". Agent ``sealer`` (tool
  ``vault.stamp``) does not: the result's one call is the refusal naming A, and no file is
  written.
* ``stuck`` serves ``hang`` (read-only by the operator's word). Agent ``hanger`` calls it for
  A: the call is stopped at ``[tools] call_timeout_s``, the server process is killed, the
  result's call says so and the task ends; while the tool hangs B answers ``GET /status``.

Each agent has exactly one tool, so the tool loop's steering rule (node/agents/loop.py: an
agent's only tool is its first step) makes the model's first step a call of that tool; the
model still writes the call under the grammar (both tools take no arguments, so the call is
complete within the step's token bound whatever the model), and a refused tool is refused by
B's tool session before the model is asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crypto.keys import Identity
from node.testnet import NodeProcess, wait_until

from .conftest import ROOT, TASKS, TEST_NETWORK_ID, TESTNET_CONFIG, Testnet, run_cli
from .procs import child_pids, gone

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

#: bound on every wait: B loads SmolLM2 and starts three MCP servers, on shared cores
CONVERGE_S = 180.0
SERVER = str(Path(__file__).with_name("mcp_tool_server.py"))
#: seconds a tool call may run (the hang's bound)
CALL_TIMEOUT_S = 8.0
#: a peer that is not A: the only one allowed to run vault.stamp
OTHER = Identity.from_seed(bytes(range(32))).peer_id
AGENTS = [
    {"name": "stamper", "description": "Stamps notes.", "skills": ["notes"],
     "tools": ["notes.stamp"]},
    {"name": "sealer", "description": "Seals notes in the vault.", "skills": ["notes"],
     "tools": ["vault.stamp"]},
    {"name": "hanger", "description": "Waits on a slow service.", "skills": ["waiting"],
     "tools": ["stuck.hang"]},
]


def _server(name: str, folder: Path, **tools: list[str]) -> dict[str, Any]:
    return {"name": name, "command": sys.executable, "args": [SERVER, str(folder)], **tools}


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[NodeProcess, NodeProcess, dict[str, Path]]]:
    root = tmp_path_factory.mktemp("agentmcp")
    folders = {name: root / name for name in ("notes", "vault", "stuck")}
    for folder in folders.values():
        folder.mkdir()
    testnet = Testnet(root / "net", network_id=TEST_NETWORK_ID, config=TESTNET_CONFIG)
    try:
        a = testnet.start("a", config={"tasks": TASKS})
        b = testnet.start("b", bootstrap=[a], config={
            "executor": {"solver": "models"},
            "agents": AGENTS,
            "tools": {"call_timeout_s": CALL_TIMEOUT_S, "max_calls": 1,
                      "notes.stamp": {"allow": [a.peer_id]},
                      "vault.stamp": {"allow": [OTHER]}},
            "mcp_servers": [
                _server("notes", folders["notes"], side_effect_tools=["stamp"]),
                _server("vault", folders["vault"], side_effect_tools=["stamp"]),
                _server("stuck", folders["stuck"], read_only_tools=["hang"]),
            ],
        })
        testnet.wait_all_connected(CONVERGE_S)
        testnet.wait_until(lambda: b.status()["services"]["ledger"]["tools"]["listed"],
                           "b's MCP servers listed", CONVERGE_S)
        testnet.wait_until(lambda: {"stamper", "sealer", "hanger"} <= _agents(a),
                           "b's agents to reach a", CONVERGE_S)
        yield a, b, folders
    finally:
        print(testnet.log_tails(60))  # shown only for a test that failed
        testnet.kill_all()


def _agents(node: NodeProcess) -> set[str]:
    reply = httpx.get(node.api_url + "/agents", timeout=5.0)
    reply.raise_for_status()
    return {x["name"] for x in reply.json()["agents"]}


def _ask_args(agent: str, question: str) -> list[str]:
    return ["ask", question, "--agent", agent, "--k", "1", "--max-tokens", "48", "--json",
            "--deadline-ms", "150000"]


def _ask(asker: NodeProcess, agent: str, question: str) -> dict[str, Any]:
    shown = run_cli(*_ask_args(agent, question), data_dir=asker.data_dir, timeout_s=200)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    return _done(shown.stdout)


def _done(stdout: str) -> dict[str, Any]:
    snap: dict[str, Any] = json.loads(stdout)
    assert snap["phase"] == "done", snap
    return snap


def test_a_side_effecting_mcp_tool_runs_only_for_an_allowed_requester(net: Any) -> None:
    a, b, folders = net
    allowed = _ask(a, "stamper", "Stamp a note saying the build passed.")
    assert (allowed["agent"], allowed["executor"]) == ("stamper", b.peer_id), allowed
    (call,) = allowed["results"][0]["tool_calls"]
    assert (call["name"], call["arguments"], call["output"]) == ("notes.stamp", {}, "stamped")
    assert (folders["notes"] / "stamp.txt").is_file()  # the side effect happened

    refused = _ask(a, "sealer", "Seal a note saying the build passed.")
    # the result's row: the 135M model's own answer after a refusal may state nothing votable
    (row,) = refused["results"]
    assert (row["agent"], row["executor"]) == ("sealer", b.peer_id), refused
    (call,) = row["tool_calls"]
    assert call["name"] == "vault.stamp" and call["output"] == (
        "error: tool 'vault.stamp' has side effects and the operator has not allowed "
        f"requester '{a.peer_id}' to run it"), refused
    assert not (folders["vault"] / "stamp.txt").exists()  # and this one did not
    # the vault server runs (it listed its tools): the refusal is the operator's, not a failure
    assert "vault.stamp" in b.status()["services"]["ledger"]["tools"]["mcp_tools"]


def test_a_hanging_mcp_tool_is_stopped_and_the_daemon_keeps_serving(net: Any) -> None:
    a, b, folders = net
    assert b.proc is not None
    (server,) = child_pids(b.proc.pid, str(folders["stuck"]))  # started to list its tools
    ask = subprocess.Popen(
        [sys.executable, "-c", "from node.cli.main import main; main()",
         *_ask_args("hanger", "Wait for the slow service."), "--data-dir", str(a.data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (folders["stuck"] / "hanging").exists(), "the hang to begin",
                   timeout_s=CONVERGE_S)
        status = httpx.get(b.api_url + "/status", timeout=5.0)
        # B answered while the tool still hung: its server had not been stopped yet
        hanging_still = not gone(server)
        stdout, stderr = ask.communicate(timeout=200)
    finally:
        if ask.poll() is None:
            ask.kill()
            ask.wait()
    assert status.status_code == 200 and status.json()["peer_id"] == b.peer_id
    assert hanging_still, "the hang ended before /status answered (call_timeout_s too short?)"
    assert ask.returncode == 0, stdout + stderr
    snap = _done(stdout)
    (row,) = snap["results"]
    assert (row["agent"], row["executor"]) == ("hanger", b.peer_id), snap
    (call,) = row["tool_calls"]
    assert call["name"] == "stuck.hang" and call["output"] == (
        f"error: tool 'stuck.hang' ran past its {CALL_TIMEOUT_S:g} s limit and was stopped")
    assert gone(server)  # the hanging server's process was killed
    assert httpx.get(b.api_url + "/status", timeout=5.0).status_code == 200

