"""`symphony mcp`: serve the network to an MCP client over stdio (node/agents/mcp_server.py).

An MCP client (an editor, an agent framework) starts ``symphony mcp`` as its stdio server;
the tools ``ask`` and ``list_agents`` go to the local daemon of ``--data-dir``.
"""

from __future__ import annotations

from pathlib import Path

import click

from node.config import default_data_dir


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="The data dir of the daemon to talk to (default: ~/.symphony).")
def mcp(data_dir: str | None) -> None:
    """Serve the network to an MCP client over stdio (tools: ask, list_agents)."""
    from node.agents.mcp_server import serve

    serve(Path(data_dir).expanduser() if data_dir else default_data_dir())
