"""Agents' tools and interfaces across real daemons (separate processes, loopback, port 0):

* B runs an MCP server from node.toml (tests/node/mcp_tool_server.py, the `mcp` package over
  stdio) and a second one whose command does not exist: the first adds its tools (``/status``,
  and B's card on A says which are side-effecting, by the operator's word), the second is
  logged and absent, and the daemon runs on; stopping B stops its server process.
* The official ``openai`` client on A lists B's agents with ``client.models.list()`` beside
  the model, and ``model=<agent name>`` gets the answer from that agent on B, while C (the
  same model, no ``[[agents]]``: the default generalist) is in the market and does not answer.
* ``symphony mcp`` on A answers ``tools/list`` and a ``tools/call`` of ask (and of
  list_agents) from the `mcp` package's own client, against the real daemon.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from mcp import Client, StdioServerParameters

from node.api.token import read_token
from node.testnet import NodeProcess

from .conftest import ARITH_SOLVER, TASKS, TEST_NETWORK_ID, TESTNET_CONFIG, Testnet
from .procs import child_pids, gone

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
openai = pytest.importorskip("openai")

CONVERGE_S = 90.0
SERVER = str(Path(__file__).with_name("mcp_tool_server.py"))
SYMPHONY = str(Path(sys.executable).with_name("symphony"))
ADDER = {"name": "adder", "description": "Adds numbers and answers sums.",
         "skills": ["arithmetic"]}
SCRIBE = {"name": "scribe", "description": "Writes notes to files.", "skills": ["notes"],
          "tools": ["notes.write_note", "notes.shout", "notes"]}
B_CONFIG = {
    "executor": {"solver": ARITH_SOLVER},
    "agents": [ADDER, SCRIBE],
    "tools": {"call_timeout_s": 2.0},
    "mcp_servers": [
        {"name": "notes", "command": sys.executable, "args": [SERVER],
         "read_only_tools": ["shout", "hang", "pid"], "side_effect_tools": ["write_note"]},
        {"name": "broken", "command": "/nonexistent/mcp-server", "start_timeout_s": 5.0},
    ],
}


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[NodeProcess, NodeProcess, NodeProcess]]:
    testnet = Testnet(tmp_path_factory.mktemp("agenttools") / "net",
                      network_id=TEST_NETWORK_ID, config=TESTNET_CONFIG)
    try:
        a = testnet.start("a", config={"tasks": TASKS})
        b = testnet.start("b", bootstrap=[a], wait=False, config=B_CONFIG)
        c = testnet.start("c", bootstrap=[a], wait=False,
                          config={"executor": {"solver": ARITH_SOLVER}})
        for node in (b, c):
            node.wait_ready()
        testnet.wait_all_connected(CONVERGE_S)
        testnet.wait_until(lambda: {(b.peer_id, "adder"), (b.peer_id, "scribe"),
                                    (c.peer_id, "generalist")} <= {
                               (x["peer_id"], x["name"]) for x in _agents(a)},
                           "b's and c's agents to reach a", CONVERGE_S)
        yield a, b, c
    except BaseException:
        print(testnet.log_tails(60))
        raise
    finally:
        testnet.kill_all()


def _agents(node: NodeProcess) -> list[dict[str, Any]]:
    reply = httpx.get(node.api_url + "/agents", timeout=5.0)
    reply.raise_for_status()
    agents: list[dict[str, Any]] = reply.json()["agents"]
    return agents


def test_an_mcp_server_adds_its_tools_and_a_broken_one_is_absent(net: Any) -> None:
    a, b, _ = net
    tools = b.status()["services"]["ledger"]["tools"]
    assert tools["listed"] and tools["builtin"] == ["calculator"]
    assert tools["mcp_tools"]["notes.shout"] == {"side_effects": False}
    assert tools["mcp_tools"]["notes.write_note"] == {"side_effects": True}
    assert not any(name.startswith("broken.") for name in tools["mcp_tools"])
    assert "broken" in tools["mcp_failed"]
    (failed,) = [e for e in b.log_events("tools.mcp_failed") if e["server"] == "broken"]
    assert "failed to start" in failed["error"]
    (scribe,) = [x for x in _agents(a) if x["name"] == "scribe"]
    assert [(t["name"], t["side_effects"]) for t in scribe["tools"]] == [
        ("notes.write_note", True), ("notes.shout", False), ("notes", True)]
    assert scribe["tools"][1]["description"] == "Answer the text upper-cased."


def test_the_openai_client_lists_agents_and_asks_one_by_name(net: Any) -> None:
    a, b, c = net
    token = read_token(a.data_dir)
    client = openai.OpenAI(base_url=f"{a.api_url}/v1", api_key=token, max_retries=0,
                           timeout=120)
    listed = {m.id: m.owned_by for m in client.models.list().data}
    assert listed == {"test-arith": "symphony", "adder": "symphony-agent",
                      "scribe": "symphony-agent", "generalist": "symphony-agent"}
    reply = client.chat.completions.create(
        model="adder", messages=[{"role": "user", "content": "What is 5 + 4?"}])
    assert reply.choices[0].message.content.endswith("Final answer: 9")
    # the task as A's API keeps it: answered by agent adder on B; C (a generalist on the same
    # model, a candidate for any ask that names no agent) made no attempt
    task_id = reply.model_extra["symphony"]["task_id"]
    shown = httpx.get(f"{a.api_url}/tasks/{task_id}", timeout=5.0,
                      headers={"Authorization": f"Bearer {token}"})
    shown.raise_for_status()
    snap = shown.json()
    assert (snap["agent"], snap["executor"]) == ("adder", b.peer_id), snap
    assert [(t["agent"], t["peer"]) for t in snap["attempts"]] == [("adder", b.peer_id)]
    assert c.peer_id not in {r["executor"] for r in snap["results"]}
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-agent",
                                       messages=[{"role": "user", "content": "hi"}])


def test_symphony_mcp_against_a_real_daemon(net: Any) -> None:
    a, b, c = net
    params = StdioServerParameters(command=SYMPHONY, args=["mcp", "--data-dir", str(a.data_dir)],
                                   env={**os.environ})

    async def main() -> dict[str, Any]:
        async with Client(params) as client:
            tools = await client.list_tools()
            asked = await client.call_tool("ask", {"question": "What is 5 + 4?", "k": 1,
                                                   "deadline_ms": 60_000})
            agents = await client.call_tool("list_agents", {})
            return {"tools": sorted(t.name for t in tools.tools), "error": asked.is_error,
                    "ask": json.loads(asked.content[0].text),  # type: ignore[union-attr]
                    "agents": json.loads(agents.content[0].text)}  # type: ignore[union-attr]

    got = trio.run(main)
    assert got["tools"] == ["ask", "list_agents"] and not got["error"]
    assert got["ask"]["phase"] == "done" and got["ask"]["answer"] == "9"
    assert got["ask"]["results"][0]["executor"] in {b.peer_id, c.peer_id}  # no agent named
    assert {x["name"] for x in got["agents"]["agents"]} == {"adder", "scribe", "generalist"}


def test_stopping_the_daemon_stops_its_mcp_server(net: Any) -> None:
    _, b, _ = net
    # the daemon keeps answering with a server that failed to start
    assert httpx.get(b.api_url + "/status", timeout=5.0).status_code == 200
    (listed,) = b.log_events("tools.mcp_listed")[-1:]
    assert "notes.pid" in listed["tools"]
    assert b.proc is not None
    children = child_pids(b.proc.pid, "mcp_tool_server")
    assert children, "the notes server runs as b's child"
    assert b.terminate() == 0
    for pid in children:
        assert gone(pid)

