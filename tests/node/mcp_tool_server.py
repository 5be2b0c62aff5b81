"""An MCP server for the tool tests, written with the ``mcp`` package, served over stdio.

Run as ``python mcp_tool_server.py [FOLDER]``. Tools:

* ``shout(text)``: read-only, answers ``text`` upper-cased;
* ``write_note(directory, name, text)``: side-effecting, writes ``text`` to
  ``<directory>/<name>`` and answers the path;
* ``stamp()``: side-effecting, writes ``FOLDER/stamp.txt`` and answers "stamped" (no
  arguments, so a model's call of it is always complete and its effect is one known file: a
  daemon test checks that file to see whether the tool ran);
* ``hang()``: never answers (sleeps forever: the caller's timeout is the bound); with a
  FOLDER it first creates ``FOLDER/hanging`` (a daemon test waits for it to know the hang
  has begun);
* ``flood(chars)``: answers ``chars`` characters of ``x``;
* ``crash()``: the process exits with status 3 before answering;
* ``pid()``: the server's process id (a test checks a stopped server is gone).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

app = MCPServer("symphony-test-tools")
#: where stamp() writes and hang() marks that it started (None: no folder given)
FOLDER = Path(sys.argv[1]) if len(sys.argv) > 1 else None


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
def stamp() -> str:
    """Stamp: write this server's stamp file."""
    if FOLDER is None:
        raise ValueError("this server was started without a folder")
    (FOLDER / "stamp.txt").write_text("stamped")
    return "stamped"


@app.tool()
def hang() -> str:
    """Never answer."""
    if FOLDER is not None:
        (FOLDER / "hanging").touch()
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
