"""This node's tools as the daemon runs them: the built-in ones and the operator's MCP servers.

Contract:
* The settings are node.toml's ``[tools]`` and ``[[mcp_servers]]`` (node/agents/settings.py),
  parsed when the config loads (``Config.tools``); an agent naming a tool the node cannot have
  was refused there.
* :meth:`NodeTools.run` is a trio service the ledger service starts in its nursery, so the
  servers live and die with the daemon: it runs ``McpServers.run`` (each server a child
  process, killed with its process group when the service is cancelled), reports ``started``
  at once, then starts every server and lists its tools (each start bounded by its
  ``start_timeout_s``). A server that fails is logged (``tools.mcp_failed``) and its tools
  are absent; nothing of it reaches the daemon. :attr:`listed` is set when every server has
  been tried.
* :meth:`tool_info` describes a tool on an agent card (node/agents/cards.py): whether it has
  side effects is the operator's word (an MCP tool is read-only only when its server's
  ``read_only_tools`` names it; a server's name stands for all its tools, read-only only when
  every listed tool is), the description is the tool's own.
* :meth:`kit` is what the executor runs an agent's tools with: the tools available now, the
  operator's :class:`~node.agents.tools.ToolPolicy` and :class:`~node.agents.tools.ToolLimits`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from node.agents.settings import McpServerConfig, ToolSettings, builtin_tools
from node.agents.tools import Tool, ToolConfigError, ToolLimits, ToolPolicy
from node.config import ConfigError
from protocol.agents.cards import MAX_TOOL_DESCRIPTION_LEN, AgentTool

if TYPE_CHECKING:
    from node.agents.mcp_tools import McpServers


class NodeTools:
    """The tools of this node (see the module docstring)."""

    def __init__(self, settings: ToolSettings, log: Any) -> None:
        self.settings = settings
        self.log = log
        try:  # a docsearch folder that cannot be read stops the start, naming it
            self.builtins: dict[str, Tool] = builtin_tools(settings)
        except ToolConfigError as exc:
            raise ConfigError(str(exc)) from None
        #: the operator's MCP servers; the MCP SDK is imported only when there are some, so a
        #: daemon without any (every light daemon) never loads it
        self.servers: McpServers | None = None
        if settings.mcp_servers:
            from node.agents.mcp_tools import McpServers

            self.servers = McpServers(settings.mcp_servers)
        #: every MCP tool listed so far, by full name (``<server>.<tool>``)
        self.mcp: dict[str, Tool] = {}
        #: set once every server has been started and listed, or has failed
        self.listed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            if self.servers is not None:
                await nursery.start(self.servers.run)
            task_status.started()
            await self.list_servers()
            await trio.sleep_forever()

    async def list_servers(self) -> None:
        """Start every server and take its tools; log each one that fails."""
        if self.servers is not None:
            self.mcp = await self.servers.tools()
            for name, error in self.servers.errors.items():
                self.log.warning("tools.mcp_failed", server=name, error=error)
            self.log.info("tools.mcp_listed", tools=sorted(self.mcp),
                          failed=sorted(self.servers.errors))
        self.listed.set()

    def available(self) -> dict[str, Tool]:
        """Every tool this node has now: built-in, and the MCP servers' that listed theirs."""
        return {**self.builtins, **self.mcp}

    def kit(self) -> tuple[Mapping[str, Tool], ToolPolicy, ToolLimits]:
        """(tools available, who may run the side-effecting ones, the bounds on every call)."""
        return self.available(), self.settings.policy, self.settings.limits

    def _server(self, name: str) -> McpServerConfig | None:
        return next((s for s in self.settings.mcp_servers if s.name == name), None)

    def tool_info(self, name: str) -> AgentTool:
        """How an agent card describes tool ``name`` (a built-in tool, an MCP tool, or an MCP
        server's name standing for all its tools)."""
        tools = self.available()
        tool = tools.get(name)
        if tool is not None:
            return AgentTool(name=name, side_effects=tool.spec.side_effects,
                             description=tool.spec.description[:MAX_TOOL_DESCRIPTION_LEN])
        server_name, _, tool_name = name.partition(".")
        server = self._server(server_name)
        if server is None:  # refused at config load; described as the riskiest kind
            return AgentTool(name=name, description="", side_effects=True)
        if tool_name:  # the server has not listed it (it failed to start): the operator's word
            return AgentTool(name=name, description="",
                             side_effects=tool_name not in server.read_only_tools)
        group = sorted((k, t) for k, t in tools.items() if k.startswith(name + "."))
        listed = ", ".join(k.partition(".")[2] for k, _ in group)
        return AgentTool(
            name=name, description=f"MCP server {name}: {listed or 'not started'}"[
                :MAX_TOOL_DESCRIPTION_LEN],
            side_effects=not group or any(t.spec.side_effects for _, t in group))

    def status(self) -> dict[str, Any]:
        return {
            "builtin": sorted(self.builtins),
            "mcp_tools": {k: {"side_effects": t.spec.side_effects}
                          for k, t in sorted(self.mcp.items())},
            "mcp_failed": dict(self.servers.errors) if self.servers is not None else {},
            "listed": self.listed.is_set(),
            "limits": {"max_calls": self.settings.limits.max_calls,
                       "call_timeout_s": self.settings.limits.call_timeout_s,
                       "max_output_chars": self.settings.limits.max_output_chars},
            "allowed": {k: len(v) for k, v in sorted(self.settings.policy.allow.items())},
        }
