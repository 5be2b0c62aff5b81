"""An MCP server for the tool tests, written with the ``mcp`` package, served over stdio.

Run as ``python mcp_tool_server.py``. Tools:

* ``shout(text)``: read-only, answers ``text`` upper-cased;
* ``write_note(directory, name, text)``: side-effecting, writes ``text`` to
  ``<directory>/<name>`` and answers the path;
* ``hang()``: never answers (sleeps forever: the caller's timeout is the bound);
* ``flood(chars)``: answers ``chars`` characters of ``x``;
* ``crash()``: the process exits with status 3 before answering;
* ``pid()``: the server's process id (a test checks a stopped server is gone).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

app = MCPServer("symphony-test-tools")


@app.tool()
def shout(text: str) -> str:
    """Answer the text upper-cased."""
    return text.upper()


@app.tool()
def write_note(directory: str, name: str, text: str) -> str:
    """Write text to a file named name in directory."""
    path = Path(directory) / name
    path.write_text(text)
    return str(path)


@app.tool()
def hang() -> str:
    """Never answer."""
    while True:
        time.sleep(3600)


@app.tool()
def flood(chars: int) -> str:
    """Answer chars characters."""
    return "x" * chars


@app.tool()
def crash() -> str:
    """Exit before answering."""
    os._exit(3)


@app.tool()
def pid() -> str:
    """This server's process id."""
    return str(os.getpid())


if __name__ == "__main__":
    app.run("stdio")
