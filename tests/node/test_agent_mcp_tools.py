"""MCP servers' tools (node/agents/mcp_tools.py) against a real server over stdio
(tests/node/mcp_tool_server.py, written with the `mcp` package): permissions, and a server
that hangs, crashes or floods is stopped while the caller gets a clear error."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from node.agents.mcp_tools import McpServerConfig, McpServers
from node.agents.tools import (
    ToolFailed,
    ToolLimits,
    ToolPolicy,
    ToolRefused,
    ToolRegistry,
    ToolSession,
)

SERVER = str(Path(__file__).with_name("mcp_tool_server.py"))
ALLOWED = "12D3KooWAllowed"
STRANGER = "12D3KooWStranger"
READ_ONLY = frozenset({"shout", "hang", "flood", "crash"})
pytestmark = pytest.mark.timeout(120)


def _config(**overrides: object) -> McpServerConfig:
    fields: dict[str, object] = dict(name="test", command=sys.executable, args=(SERVER,),
                                     read_only_tools=READ_ONLY,
                                     side_effect_tools=frozenset({"write_note"}))
    fields.update(overrides)
    return McpServerConfig(**fields)  # type: ignore[arg-type]


def _with_servers(config: McpServerConfig,
                  body: Callable[[McpServers], Awaitable[None]]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            hub: McpServers = await nursery.start(McpServers([config]).run)
            await body(hub)
            nursery.cancel_scope.cancel()
    trio.run(main)


def _session(registry: ToolRegistry, requester: str, **limits: object) -> ToolSession:
    policy = ToolPolicy({"test.write_note": frozenset({ALLOWED})})
    return ToolSession(registry, policy, ToolLimits(**limits), requester)  # type: ignore[arg-type]


def test_side_effecting_tool_refused_unless_allowed(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"

    async def body(hub: McpServers) -> None:
        registry = ToolRegistry((await hub.tools()).values())
        specs = {s.name: s.side_effects for s in registry.specs}
        # declared read-only, declared side-effecting, and undeclared (side-effecting)
        assert specs["test.shout"] is False and specs["test.write_note"] is True
        assert specs["test.pid"] is True
        args = {"directory": str(tmp_path), "name": "note.txt", "text": "hello"}
        stranger = _session(registry, STRANGER)
        assert await stranger.call("test.shout", {"text": "hi"}) == "HI"
        with pytest.raises(ToolRefused, match="side effects"):
            await stranger.call("test.write_note", args)
        with pytest.raises(ToolRefused, match="side effects"):
            await stranger.call("test.pid", {})
        assert not note.exists()
        allowed = _session(registry, ALLOWED)
        assert await allowed.call("test.write_note", args) == str(note)
        assert note.read_text() == "hello"

    _with_servers(_config(), body)


def test_a_hanging_tool_is_stopped_at_its_timeout_and_the_server_restarts() -> None:
    async def body(hub: McpServers) -> None:
        server = hub.servers["test"]
        registry = ToolRegistry((await hub.tools()).values())
        policy = ToolPolicy({"test.pid": frozenset({ALLOWED})})
        session = ToolSession(registry, policy, ToolLimits(call_timeout_s=1.0), ALLOWED)
        old_pid = int(await session.call("test.pid", {}))
        with pytest.raises(ToolFailed, match="ran past its 1 s limit and was stopped"):
            await session.call("test.hang", {})
        assert not server.running
        await server.wait_stopped()
        with pytest.raises(ProcessLookupError):
            os.kill(old_pid, 0)  # killed and reaped
        assert await session.call("test.shout", {"text": "again"}) == "AGAIN"
        assert int(await session.call("test.pid", {})) != old_pid and server.starts == 2

    _with_servers(_config(), body)


def test_a_crashing_server_gives_a_clear_error_and_restarts() -> None:
    async def body(hub: McpServers) -> None:
        registry = ToolRegistry((await hub.tools()).values())
        session = _session(registry, STRANGER)
        with pytest.raises(ToolFailed, match="closed the connection during the call"):
            await session.call("test.crash", {})
        assert await session.call("test.shout", {"text": "up"}) == "UP"
        assert hub.servers["test"].starts == 2

    _with_servers(_config(), body)


def test_a_flooding_tool_is_capped_and_a_flooding_server_stopped() -> None:
    async def body(hub: McpServers) -> None:
        registry = ToolRegistry((await hub.tools()).values())
        session = _session(registry, STRANGER, max_output_chars=1000)
        out = await session.call("test.flood", {"chars": 50_000})
        assert out == "x" * 1000 + "\n[output truncated: 49000 of 50000 characters dropped]"
        with pytest.raises(ToolFailed, match="longer than 200000 bytes and was stopped"):
            await session.call("test.flood", {"chars": 1_000_000})
        assert not hub.servers["test"].running
        assert await session.call("test.shout", {"text": "ok"}) == "OK"

    _with_servers(_config(max_message_bytes=200_000), body)


def test_a_server_that_cannot_start_is_reported() -> None:
    async def body(hub: McpServers) -> None:
        assert await hub.tools() == {}
        assert "failed to start" in hub.errors["test"]

    _with_servers(_config(command="/nonexistent/mcp-server"), body)


def test_a_server_that_never_answers_the_start_is_stopped(tmp_path: Path) -> None:
    silent = tmp_path / "silent.py"
    silent.write_text("import time\nwhile True:\n    time.sleep(3600)\n")

    async def body(hub: McpServers) -> None:
        assert await hub.tools() == {}
        assert "did not start within 1 s" in hub.errors["test"]

    _with_servers(_config(args=(str(silent),), start_timeout_s=1.0), body)
