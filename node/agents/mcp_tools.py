"""Tools of the MCP servers the operator configures (``[[mcp_servers]]``), run by the daemon.

Contract:
* Each server is a child process spoken to over stdio (node/agents/mcp_transport.py) through
  the ``mcp`` package's ``Client``, which is anyio-based and runs on the daemon's trio loop.
  A server starts lazily, on the first listing or call, inside the nursery of
  :meth:`McpServers.run` (a trio service), and is stopped when that service ends.
* Its tools are named ``<server>.<tool>``. Whether a tool has side effects is the operator's
  word, never the server's: a tool in ``read_only_tools`` is read-only, every other tool,
  declared in ``side_effect_tools`` or not declared at all, has side effects.
* A call that does not finish (timed out by the caller's cancel scope, cancelled), a server
  that closes the connection (crashed, exited) or writes a message over the transport's bound
  (flooded) gets the server killed (SIGKILL to its process group); the call raises
  :class:`~node.agents.tools.ToolFailed` saying what happened, and the next use starts a new
  process. A server's failure never reaches the daemon's nursery.
* What a server says is bounded before it is used: at most ``MAX_TOOLS_PER_SERVER`` tools,
  names that fit ``TOOL_NAME_RE``, descriptions cut to ``MAX_DESCRIPTION_CHARS``, argument
  schemas of at most ``MAX_SCHEMA_BYTES`` (a larger one is replaced by a bare object schema).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, TextContent
from mcp_types import Tool as McpToolListing

from node.agents.mcp_transport import StdioTransport
from node.agents.settings import McpServerConfig
from node.agents.tools import TOOL_NAME_RE, Tool, ToolFailed, ToolSpec

log = logging.getLogger(__name__)

MAX_TOOLS_PER_SERVER = 64
MAX_DESCRIPTION_CHARS = 1000
MAX_SCHEMA_BYTES = 8192
#: characters of a tool's own error message passed on
MAX_ERROR_CHARS = 500


@dataclass(slots=True)
class _Connection:
    client: Client
    transport: StdioTransport
    specs: list[tuple[str, ToolSpec]]
    stop: trio.Event
    done: trio.Event


def _spec(server: McpServerConfig, listing: McpToolListing) -> ToolSpec:
    schema: Mapping[str, Any] = listing.input_schema
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        schema = {"type": "object"}
    return ToolSpec(name=f"{server.name}.{listing.name}",
                    description=(listing.description or "")[:MAX_DESCRIPTION_CHARS],
                    parameters=schema, side_effects=listing.name not in server.read_only_tools)


def _result_text(result: CallToolResult) -> str:
    parts = [block.text if isinstance(block, TextContent) else f"[{block.type} content omitted]"
             for block in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content)]
    return "\n".join(parts)


class McpServer:
    """One configured server: started on first use, killed when a call goes wrong."""

    def __init__(self, config: McpServerConfig, nursery: trio.Nursery) -> None:
        self.config = config
        self._nursery = nursery
        self._conn: _Connection | None = None
        self._last: _Connection | None = None
        self._lock = trio.Lock()
        #: processes started so far (a restart after a kill adds one)
        self.starts = 0

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def running(self) -> bool:
        return self._conn is not None and not self._conn.stop.is_set()

    async def tools(self) -> list[McpTool]:
        """This server's tools (starting it if needed)."""
        conn = await self._connection()
        return [McpTool(server=self, tool=tool, spec=spec) for tool, spec in conn.specs]

    async def start(self) -> None:
        """Start the server unless it runs (bounded by ``start_timeout_s``)."""
        await self._connection()

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        conn = await self._connection()
        finished = False
        try:
            result = await conn.client.call_tool(tool, arguments)
            finished = True
        except MCPError as exc:
            if conn.transport.flooded:
                raise ToolFailed(f"MCP server {self.name!r} wrote a message longer than "
                                 f"{self.config.max_message_bytes} bytes and was stopped") from None
            if exc.error.code != CONNECTION_CLOSED:
                finished = True  # the server answered with an error and keeps running
                raise ToolFailed(f"{self.name}.{tool}: {str(exc)[:MAX_ERROR_CHARS]}") from None
            raise ToolFailed(f"MCP server {self.name!r} closed the connection during the call "
                             "(it exited or crashed); it restarts on the next call") from None
        except Exception as exc:  # a result that fails the SDK's validation, a broken pipe
            raise ToolFailed(f"MCP server {self.name!r} gave a bad answer to {tool!r} "
                             f"({type(exc).__name__}) and was stopped") from None
        finally:
            if not finished:
                self._kill(conn)
        text = _result_text(result)
        if result.is_error:
            raise ToolFailed(f"{self.name}.{tool} failed: {text[:MAX_ERROR_CHARS]}")
        return text

    def stop(self) -> None:
        """Kill the server now, if it runs; the next use starts it again."""
        if self._conn is not None:
            self._kill(self._conn)

    async def wait_stopped(self) -> None:
        """Return once the last process started has been killed and reaped."""
        if self._last is not None:
            await self._last.done.wait()

    def _kill(self, conn: _Connection) -> None:
        conn.transport.kill()
        conn.stop.set()
        if self._conn is conn:
            self._conn = None

    async def _connection(self) -> _Connection:
        async with self._lock:
            if self._conn is not None and not self._conn.stop.is_set():
                return self._conn
            await self.wait_stopped()  # never two processes of one server at once
            try:
                with trio.fail_after(self.config.start_timeout_s):
                    conn: _Connection = await self._nursery.start(self._serve)
            except trio.TooSlowError:
                raise ToolFailed(f"MCP server {self.name!r} did not start within "
                                 f"{self.config.start_timeout_s:g} s") from None
            except Exception as exc:  # the command is missing, the server broke the protocol
                raise ToolFailed(f"MCP server {self.name!r} failed to start: "
                                 f"{_describe(exc)}") from None
            self._conn = self._last = conn
            return conn

    async def _serve(self, task_status: trio.TaskStatus[_Connection] = trio.TASK_STATUS_IGNORED
                     ) -> None:
        """Own one server process from start to kill (anyio's scopes must close in the task
        that opened them, hence one task per process)."""
        c = self.config
        transport = StdioTransport(c.command, c.args, env=c.env, cwd=c.cwd,
                                   stderr_path=c.stderr_path,
                                   max_message_bytes=c.max_message_bytes)
        stop, done = trio.Event(), trio.Event()
        started = False
        self.starts += 1
        try:
            async with Client(transport) as client:
                listing = await client.list_tools()
                specs = [(t.name, _spec(c, t)) for t in listing.tools[:MAX_TOOLS_PER_SERVER]
                         if TOOL_NAME_RE.fullmatch(f"{c.name}.{t.name}")]
                task_status.started(_Connection(client, transport, specs, stop, done))
                started = True
                await stop.wait()
                transport.kill()
        except Exception as exc:
            if not started:
                raise
            # after the start, a broken server shows in its next call; the daemon's nursery
            # must never see it
            log.info("mcp server %s ended: %s", c.name, _describe(exc))
        finally:
            transport.kill()
            done.set()


@dataclass(frozen=True, slots=True)
class McpTool:
    """One tool of one server, as the registry sees it."""

    server: McpServer
    tool: str
    spec: ToolSpec

    async def prepare(self) -> None:
        await self.server.start()

    async def run(self, arguments: dict[str, Any]) -> str:
        return await self.server.call(self.tool, arguments)


class McpServers:
    """Every configured server; a trio service: ``servers = await nursery.start(hub.run)``."""

    def __init__(self, configs: Sequence[McpServerConfig]) -> None:
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ValueError(f"two MCP servers share a name: {sorted(names)}")
        self.configs = list(configs)
        self.servers: dict[str, McpServer] = {}
        #: server name -> why its tools are missing from the last :meth:`tools`
        self.errors: dict[str, str] = {}

    async def run(self, *, task_status: trio.TaskStatus[McpServers] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self.servers = {c.name: McpServer(c, nursery) for c in self.configs}
            try:
                task_status.started(self)
                await trio.sleep_forever()
            finally:
                for server in self.servers.values():
                    server.stop()

    async def tools(self) -> dict[str, Tool]:
        """Every tool of every server that starts, by full name; the others are in ``errors``."""
        found: dict[str, Tool] = {}
        self.errors = {}
        for name, server in self.servers.items():
            try:
                found.update((t.spec.name, t) for t in await server.tools())
            except ToolFailed as exc:
                self.errors[name] = str(exc)
        return found


def _describe(exc: BaseException) -> str:
    """A one-line account of an error, looking inside exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
