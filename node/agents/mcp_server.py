"""``symphony mcp``: the network served to any MCP client over stdio.

Tools:

* ``ask(question, k?, needs?, agent?, deadline_ms?)``: asks the network through the local
  daemon (``POST /tasks/``, what ``symphony ask --json`` does) and answers the task snapshot
  as JSON (answer, votes, results). ``needs`` and ``agent`` are passed on only when given.
* ``list_agents()``: the network's agents, from ``GET /agents``; a daemon without that
  endpoint (404) gets a list derived from ``GET /ledger/peers``: one entry per served model of
  each live peer.

It talks to the daemon of ``data_dir`` with the CLI's own client (node/control.py: the address
from the data dir, the API token for POST). Stdout belongs to the MCP protocol, so nothing
else is printed there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from node.control import ApiClient, DaemonNotRunning, refusal

#: the client waits this much longer than the task's deadline for the daemon's answer
ASK_GRACE_S = 15.0
DEFAULT_DEADLINE_MS = 120_000
MAX_DEADLINE_MS = 24 * 3600 * 1000


class DaemonError(ToolError):
    """The daemon is not running, or refused; the message says which (the MCP client gets it
    as the tool's error result)."""


def _request(data_dir: Path, method: str, path: str, body: Any = None,
             timeout_s: float = 10.0) -> Any:
    try:
        with ApiClient(data_dir, timeout_s=timeout_s) as client:
            return client.post(path, body) if method == "POST" else client.get(path)
    except DaemonNotRunning as exc:
        raise DaemonError(str(exc)) from None
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == 404:
            raise
        raise DaemonError(f"the daemon refused: {refusal(exc)}") from None


def ask_body(question: str, k: int | None, needs: str | None, agent: str | None,
             deadline_ms: int) -> dict[str, Any]:
    if not 1000 <= deadline_ms <= MAX_DEADLINE_MS:
        raise DaemonError(f"deadline_ms must be in [1000, {MAX_DEADLINE_MS}]")
    body: dict[str, Any] = {"question": question, "answer_type": "text",
                            "deadline_ms": deadline_ms}
    for key, value in (("k", k), ("needs", needs), ("agent", agent)):
        if value is not None:
            body[key] = value
    return body


def agents_from_ledger(peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One agent per model each live peer serves (a daemon from before agent cards)."""
    found = []
    for peer in peers:
        record = peer.get("record", peer)
        for model in record.get("models", []):
            found.append({"agent": model.get("name"), "node": record.get("peer_id"),
                          "skills": list(record.get("tags", [])),
                          "price_per_1k_tokens": record.get("price_per_1k_tokens"),
                          "reputation": peer.get("reputation")})
    return found


def build_server(data_dir: Path) -> MCPServer:
    app = MCPServer("symphony", instructions="Ask the symphony network of AI agents.")

    @app.tool()
    async def ask(question: str, k: int | None = None, needs: str | None = None,
                  agent: str | None = None, deadline_ms: int = DEFAULT_DEADLINE_MS) -> str:
        """Ask the network a question; answers the task as JSON (answer, votes, results)."""
        body = ask_body(question, k, needs, agent, deadline_ms)
        timeout_s = deadline_ms / 1000 + ASK_GRACE_S
        snap = await anyio.to_thread.run_sync(
            lambda: _request(data_dir, "POST", "/tasks/", body, timeout_s))
        return json.dumps(snap, sort_keys=True)

    @app.tool()
    async def list_agents() -> str:
        """The network's agents: name, node, skills, price, reputation (JSON)."""
        def fetch() -> Any:
            try:
                return _request(data_dir, "GET", "/agents")
            except httpx.HTTPStatusError:  # 404: a daemon without agent cards
                peers = _request(data_dir, "GET", "/ledger/peers")
                return {"agents": agents_from_ledger(peers.get("peers", []))}
        return json.dumps(await anyio.to_thread.run_sync(fetch), sort_keys=True)

    return app


def serve(data_dir: Path) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    build_server(data_dir).run("stdio")
