"""`symphony mcp` (node/agents/mcp_server.py) driven by the `mcp` package's own stdio client.

The daemon side is a small HTTP double on 127.0.0.1 (port 0) that answers the three routes the
MCP server uses the way the daemon's API does (``POST /tasks/`` with the bearer token,
``GET /agents`` answering 404 as today's daemon does, ``GET /ledger/peers``) and records what
it was sent; the daemon's own routes have their own tests.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client, StdioServerParameters

from node.control import write_daemon_info

SYMPHONY = str(Path(sys.executable).with_name("symphony"))
TOKEN = "test-token"
PEER = "12D3KooWServer"
pytestmark = pytest.mark.timeout(120)


class FakeDaemonApi(BaseHTTPRequestHandler):
    asked: list[dict[str, Any]] = []

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/ledger/peers":
            self._answer(200, {"peers": [{
                "peer_id": PEER, "models": [{"name": "smollm2-135m-instruct-q4_1"}],
                "tags": ["math"], "price_per_1k_tokens": 0.0, "self": True,
                "reputation": {"score": 1.0}}]})
        else:
            self._answer(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._answer(401, {"error": "token"})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.asked.append(body)
        self._answer(200, {"task_id": "ab" * 16, "phase": "done", "answer": "4",
                           "question": body["question"]})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeDaemonApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    write_daemon_info(tmp_path, {"pid": os.getpid(), "api_url": f"http://127.0.0.1:{port}",
                                 "peer_id": PEER, "network_id": "test", "addresses": []})
    token = tmp_path / "api.token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    FakeDaemonApi.asked = []
    yield tmp_path
    server.shutdown()
    thread.join()


def test_tools_list_ask_and_list_agents(data_dir: Path) -> None:
    params = StdioServerParameters(command=SYMPHONY, args=["mcp", "--data-dir", str(data_dir)])

    async def main() -> dict[str, Any]:
        async with Client(params) as client:
            tools = await client.list_tools()
            asked = await client.call_tool("ask", {"question": "What is 2+2?", "k": 1})
            agents = await client.call_tool("list_agents", {})
            return {"tools": sorted(t.name for t in tools.tools),
                    "ask": json.loads(asked.content[0].text),  # type: ignore[union-attr]
                    "agents": json.loads(agents.content[0].text)}  # type: ignore[union-attr]

    got = trio.run(main)
    assert got["tools"] == ["ask", "list_agents"]
    assert got["ask"]["answer"] == "4" and got["ask"]["question"] == "What is 2+2?"
    assert FakeDaemonApi.asked == [{"question": "What is 2+2?", "answer_type": "text",
                                    "deadline_ms": 120_000, "k": 1}]
    assert got["agents"] == {"agents": [{
        "agent": "smollm2-135m-instruct-q4_1", "node": PEER, "skills": ["math"],
        "price_per_1k_tokens": 0.0, "reputation": {"score": 1.0}}]}


def test_no_daemon_is_a_clear_tool_error(tmp_path: Path) -> None:
    params = StdioServerParameters(command=SYMPHONY, args=["mcp", "--data-dir", str(tmp_path)])

    async def main() -> Any:
        async with Client(params) as client:
            return await client.call_tool("ask", {"question": "hi"})

    result = trio.run(main)
    assert result.is_error
    assert "no daemon is running" in result.content[0].text  # type: ignore[union-attr]
