"""The operator's tool settings in node.toml: the ``[tools]`` table and ``[[mcp_servers]]``.

Shape (every key optional; an unknown key or a wrong type is a ToolConfigError naming it, which
node/config.py raises as its ConfigError when it loads node.toml)::

    [tools]                      # bounds on every tool call of a task
    max_calls = 4                # tool calls per task
    call_timeout_s = 10.0        # seconds per call
    max_output_chars = 4000      # characters of one call's output passed on

    [tools.docsearch]            # the built-in docsearch exists only with a folder
    folder = "~/docs"

    [tools."files.write_note"]   # a side-effecting tool runs only for the peers listed
    allow = ["12D3KooW..."]

    [[mcp_servers]]
    name = "files"               # its tools are "files.<tool>"
    command = "python3"
    args = ["files_server.py"]
    env = { NOTES = "/srv/notes" }
    cwd = "/srv"                 # optional
    read_only_tools = ["read_note"]      # only these are read-only
    side_effect_tools = ["write_note"]   # documentation: every other tool has side effects
    start_timeout_s = 30.0       # optional
    stderr_log = "/var/log/files-mcp.log"  # optional; default: discarded

``allow`` lists libp2p peer ids (checked); there is no wildcard, so a side-effecting tool
runs only for requesters named one by one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crypto.peer_id import InvalidPeerId, public_key_from_peer_id
from node.agents.calculator import Calculator
from node.agents.config import AgentSpec
from node.agents.docsearch import DocSearch
from node.agents.tools import TOOL_NAME_RE, Tool, ToolConfigError, ToolLimits, ToolPolicy

LIMIT_KEYS = ("max_calls", "call_timeout_s", "max_output_chars")
TOOL_TABLE_KEYS = ("allow", "folder")
SERVER_KEYS = ("name", "command", "args", "env", "cwd", "read_only_tools",
               "side_effect_tools", "start_timeout_s", "stderr_log")
MAX_MCP_SERVERS = 16
MAX_ALLOWED_PEERS = 1000
#: seconds a server has to start and list its tools
START_TIMEOUT_S = 30.0
#: bytes of one JSON-RPC message from a server; a longer line kills it (mcp_transport.py)
MAX_MESSAGE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class McpServerConfig:
    """One ``[[mcp_servers]]`` table of node.toml (run by node/agents/mcp_tools.py)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    #: added to the minimal environment the server gets (PATH, HOME, ...)
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    #: the only tools of this server treated as read-only
    read_only_tools: frozenset[str] = frozenset()
    #: tools the operator states have side effects (any tool not read-only is treated so)
    side_effect_tools: frozenset[str] = frozenset()
    start_timeout_s: float = START_TIMEOUT_S
    max_message_bytes: int = MAX_MESSAGE_BYTES
    #: where the server's stderr goes (appended); None: discarded
    stderr_path: Path | None = None


@dataclass(frozen=True, slots=True)
class ToolSettings:
    limits: ToolLimits = ToolLimits()
    policy: ToolPolicy = ToolPolicy()
    docsearch_folder: Path | None = None
    mcp_servers: tuple[McpServerConfig, ...] = field(default_factory=tuple)


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ToolConfigError(f"{where} must be a list of strings, got {value!r}")
    return tuple(value)


def _number(value: object, where: str, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            (kind is int and not isinstance(value, int)):
        raise ToolConfigError(f"{where} must be {'an integer' if kind is int else 'a number'}, "
                              f"got {value!r}")
    return kind(value)


def _allow(value: object, where: str) -> frozenset[str]:
    peers = _strings(value, where)
    if len(peers) > MAX_ALLOWED_PEERS:
        raise ToolConfigError(f"{where} lists more than {MAX_ALLOWED_PEERS} peers")
    for peer in peers:
        try:
            public_key_from_peer_id(peer)
        except InvalidPeerId as exc:
            raise ToolConfigError(f"{where}: {exc} (list peer ids one by one; there is no "
                                  "wildcard)") from None
    return frozenset(peers)


def _tools_table(table: Mapping[str, Any], source: str
                 ) -> tuple[ToolLimits, ToolPolicy, Path | None]:
    limits: dict[str, Any] = {}
    allow: dict[str, frozenset[str]] = {}
    folder: Path | None = None
    for key, value in table.items():
        where = f"{source}: tools.{key}"
        if key in LIMIT_KEYS:
            limits[key] = _number(value, where, float if key.endswith("_s") else int)
            continue
        if not isinstance(value, Mapping):
            raise ToolConfigError(f"{where}: unknown key (limits: {', '.join(LIMIT_KEYS)}; "
                                  "a tool's settings are a table [tools.<name>])")
        if not TOOL_NAME_RE.fullmatch(key):
            raise ToolConfigError(f"{where}: {key!r} is not a tool name")
        for sub, subvalue in value.items():
            if sub == "allow":
                allow[key] = _allow(subvalue, f"{where}.allow")
            elif sub == "folder" and key == "docsearch" and isinstance(subvalue, str):
                folder = Path(subvalue).expanduser()
            else:
                raise ToolConfigError(f"{where}: unknown key {sub!r} or wrong type (known: allow; "
                                      "folder for docsearch, a string)")
    try:
        return ToolLimits(**limits), ToolPolicy(allow), folder
    except ToolConfigError as exc:
        raise ToolConfigError(f"{source}: {exc}") from None


def _server(table: object, source: str, index: int) -> McpServerConfig:
    where = f"{source}: mcp_servers[{index}]"
    if not isinstance(table, Mapping):
        raise ToolConfigError(f"{where} must be a table")
    unknown = sorted(set(table) - set(SERVER_KEYS))
    if unknown:
        raise ToolConfigError(f"{where}: unknown key(s) {unknown} "
                              f"(known: {', '.join(SERVER_KEYS)})")
    name, command = table.get("name"), table.get("command")
    if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name) or "." in name:
        raise ToolConfigError(f"{where}.name must be a name of letters, digits, _ and -")
    if not isinstance(command, str) or not command:
        raise ToolConfigError(f"{where}.command must be a non-empty string")
    env = table.get("env", {})
    if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ToolConfigError(f"{where}.env must be a table of strings")
    paths = {}
    for key in ("cwd", "stderr_log"):
        if key in table:
            if not isinstance(table[key], str):
                raise ToolConfigError(f"{where}.{key} must be a path string")
            paths[key] = Path(table[key]).expanduser()
    start = _number(table.get("start_timeout_s", START_TIMEOUT_S), f"{where}.start_timeout_s",
                    float)
    if not 0 < start <= 600:
        raise ToolConfigError(f"{where}.start_timeout_s must be in (0, 600]")
    return McpServerConfig(
        name=name, command=command, args=_strings(table.get("args", []), f"{where}.args"),
        env=dict(env), cwd=paths.get("cwd"), stderr_path=paths.get("stderr_log"),
        read_only_tools=frozenset(_strings(table.get("read_only_tools", []),
                                           f"{where}.read_only_tools")),
        side_effect_tools=frozenset(_strings(table.get("side_effect_tools", []),
                                             f"{where}.side_effect_tools")),
        start_timeout_s=start)


def parse_tool_settings(tools: Mapping[str, Any] | None = None,
                        mcp_servers: Sequence[Any] | None = None,
                        source: str = "node.toml",
                        error: type[ValueError] = ToolConfigError) -> ToolSettings:
    """The settings of a node.toml's ``[tools]`` table and ``[[mcp_servers]]`` array; a
    mistake raises ``error`` (node/config.py passes its ConfigError) naming the key."""
    try:
        return _parse_tool_settings(tools, mcp_servers, source)
    except ToolConfigError as exc:
        raise error(str(exc)) from None


def _parse_tool_settings(tools: Mapping[str, Any] | None, mcp_servers: Sequence[Any] | None,
                         source: str) -> ToolSettings:
    limits, policy, folder = _tools_table(tools or {}, source)
    if not isinstance(mcp_servers or [], list | tuple):
        raise ToolConfigError(f"{source}: mcp_servers must be an array of tables [[mcp_servers]]")
    servers = tuple(_server(t, source, i) for i, t in enumerate(mcp_servers or []))
    if len(servers) > MAX_MCP_SERVERS:
        raise ToolConfigError(f"{source}: more than {MAX_MCP_SERVERS} mcp_servers")
    names = [s.name for s in servers]
    if len(set(names)) != len(names) or {"calculator", "docsearch"} & set(names):
        raise ToolConfigError(f"{source}: mcp_servers names must be unique and not a built-in "
                              f"tool's: {names}")
    return ToolSettings(limits=limits, policy=policy, docsearch_folder=folder,
                        mcp_servers=servers)


def builtin_tools(settings: ToolSettings) -> dict[str, Tool]:
    """The built-in tools this node has: the calculator, and docsearch when a folder is set."""
    found: dict[str, Tool] = {"calculator": Calculator()}
    if settings.docsearch_folder is not None:
        try:
            found["docsearch"] = DocSearch(settings.docsearch_folder)
        except (OSError, ValueError) as exc:
            raise ToolConfigError(f"tools.docsearch.folder {settings.docsearch_folder}: "
                              f"{exc}") from None
    return found


def check_agent_tools(agents: Sequence[AgentSpec], settings: ToolSettings,
                      error: type[ValueError] = ToolConfigError) -> None:
    """Every tool an ``[[agents]]`` table names is one this node can have: ``calculator``,
    ``docsearch`` (with a folder set), a configured MCP server's name (all its tools) or one
    of its tools (``<server>.<tool>``); else ``error`` naming the agent and the tool. Whether
    an MCP server's tool exists is known only once it runs: a server that fails to start
    leaves its agents without those tools (node/agents/toolbox.py), it stops nothing."""
    servers = {s.name for s in settings.mcp_servers}
    have = {"calculator", *(["docsearch"] if settings.docsearch_folder else [])}
    for agent in agents:
        for name in agent.tools:
            if name not in have and name.partition(".")[0] not in servers:
                raise error(f"[[agents]] {agent.name}: key 'tools': {name!r} is not a tool of "
                            f"this node (built-in: {', '.join(sorted(have))}; MCP servers: "
                            f"{', '.join(sorted(servers)) or 'none'})")
