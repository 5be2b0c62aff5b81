"""The daemon's tools (node/agents/toolbox.py) from node.toml's [tools] and [[mcp_servers]],
parsed by the daemon's own config loader, against the real MCP test server over stdio
(tests/node/mcp_tool_server.py): what cards say of each tool, the permission check on what
the executor gets from ``kit()``, a server that cannot start, and servers stopped with the
service."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from crypto.keys import Identity
from node.agents.config import AgentSpec
from node.agents.toolbox import NodeTools
from node.agents.tools import ToolRefused, ToolSession, build_registry
from node.config import Config, ConfigError, load_config

SERVER = str(Path(__file__).with_name("mcp_tool_server.py"))
ALLOWED = Identity.from_seed(bytes([1]) * 32).peer_id
STRANGER = Identity.from_seed(bytes([2]) * 32).peer_id
pytestmark = pytest.mark.timeout(120)


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    info = warning


def _toml(tmp_path: Path, command: str = sys.executable, extra: str = "") -> Config:
    path = tmp_path / "node.toml"
    path.write_text(f'''
[tools]
max_calls = 3
call_timeout_s = 2.0
[tools."notes.write_note"]
allow = ["{ALLOWED}"]

[[mcp_servers]]
name = "notes"
command = "{command}"
args = ["{SERVER}"]
read_only_tools = ["shout", "hang", "pid"]
side_effect_tools = ["write_note"]
start_timeout_s = 20.0

[[agents]]
name = "scribe"
description = "Writes notes."
tools = ["notes.write_note", "notes.shout", "calculator"]
{extra}''')
    return load_config({"data_dir": str(tmp_path)}, env={}, config_file=path)


def _with_tools(config: Config, body: Callable[[NodeTools], Awaitable[None]]) -> Log:
    log = Log()

    async def main() -> None:
        tools = NodeTools(config.tools, log)
        async with trio.open_nursery() as nursery:
            await nursery.start(tools.run)
            with trio.fail_after(60):
                await tools.listed.wait()
            await body(tools)
            nursery.cancel_scope.cancel()
    trio.run(main)
    return log


def test_config_load_reads_the_tables(tmp_path: Path) -> None:
    config = _toml(tmp_path)
    assert config.tools.limits.max_calls == 3 and config.tools.limits.call_timeout_s == 2.0
    assert config.tools.policy.allow == {"notes.write_note": frozenset({ALLOWED})}
    (server,) = config.tools.mcp_servers
    assert server.name == "notes" and server.read_only_tools == {"shout", "hang", "pid"}
    assert [a.tools for a in config.agents] == [("notes.write_note", "notes.shout",
                                                  "calculator")]


@pytest.mark.parametrize("extra, match", [
    ("[tools.calculator]\nalow = []", "unknown key 'alow'"),
    ("[mcp_servers.0]\n", "mcp_servers"),
    ('[[agents]]\nname = "x"\ndescription = "y"\ntools = ["docsearch"]', "'docsearch' is not a"),
    ('[[agents]]\nname = "x"\ndescription = "y"\ntools = ["files.read"]', "'files.read' is not"),
])
def test_config_load_refuses_naming_the_key(tmp_path: Path, extra: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _toml(tmp_path, extra=extra)


def test_an_unknown_server_key_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[[mcp_servers]]\nname = "x"\ncommand = "c"\nshell = true\n')
    with pytest.raises(ConfigError, match="shell"):
        load_config({"data_dir": str(tmp_path)}, env={}, config_file=path)


def test_cards_describe_tools_by_the_operators_word(tmp_path: Path) -> None:
    async def body(tools: NodeTools) -> None:
        info = {n: tools.tool_info(n) for n in ("calculator", "notes.shout", "notes.write_note",
                                                "notes")}
        assert not info["calculator"].side_effects and not info["notes.shout"].side_effects
        assert info["notes.write_note"].side_effects
        assert info["notes"].side_effects  # its tools include a side-effecting one
        assert info["notes.shout"].description == "Answer the text upper-cased."
        assert "write_note" in info["notes"].description
        assert tools.status()["mcp_tools"]["notes.write_note"] == {"side_effects": True}

    _with_tools(_toml(tmp_path), body)


def test_the_kit_refuses_a_side_effecting_tool_to_a_requester_not_allowed(tmp_path: Path
                                                                        ) -> None:
    agent = AgentSpec(name="scribe", description="d", tools=("notes",))

    async def body(tools: NodeTools) -> None:
        available, policy, limits = tools.kit()
        assert limits.max_calls == 3
        registry = build_registry(agent.tools, available)
        arguments = {"directory": str(tmp_path), "name": "n.txt", "text": "hi"}
        stranger = ToolSession(registry, policy, limits, STRANGER)
        assert "notes.write_note" not in {s.name for s in stranger.usable_specs()}
        with pytest.raises(ToolRefused, match="has side effects"):
            await stranger.call("notes.write_note", arguments)
        assert not (tmp_path / "n.txt").exists()
        assert await stranger.call("notes.shout", {"text": "hi"}) == "HI"
        allowed = ToolSession(registry, policy, limits, ALLOWED)
        assert await allowed.call("notes.write_note", arguments) == str(tmp_path / "n.txt")
        assert (tmp_path / "n.txt").read_text() == "hi"

    _with_tools(_toml(tmp_path), body)


def test_a_server_that_cannot_start_is_logged_and_its_tools_are_absent(tmp_path: Path) -> None:
    async def body(tools: NodeTools) -> None:
        assert sorted(tools.available()) == ["calculator"]
        assert "notes" in tools.status()["mcp_failed"]
        # the operator's word still describes the tools on the card
        assert tools.tool_info("notes.write_note").side_effects
        assert not tools.tool_info("notes.shout").side_effects
        assert tools.tool_info("notes").side_effects

    log = _with_tools(_toml(tmp_path, command=str(tmp_path / "no-such-command")), body)
    assert [e for e, f in log.events if e == "tools.mcp_failed" and f["server"] == "notes"]


def test_servers_stop_with_the_service(tmp_path: Path) -> None:
    pids: list[int] = []

    async def body(tools: NodeTools) -> None:
        available, policy, limits = tools.kit()
        session = ToolSession(build_registry(["notes.pid"], available), policy, limits,
                              STRANGER)
        pids.append(int(await session.call("notes.pid", {})))
        os.kill(pids[0], 0)  # it runs

    _with_tools(_toml(tmp_path), body)
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
