"""`symphony mcp`: serve the network to an MCP client over stdio (node/agents/mcp_server.py).

An MCP client (an editor, an agent framework) starts ``symphony mcp`` as its stdio server;
the tools ``ask`` and ``list_agents`` go to the local daemon of ``--data-dir``.
"""

from __future__ import annotations

import click

from node.cli.daemon_api import data_dir_option, resolve_data_dir


@click.command()
@data_dir_option
def mcp(data_dir: str | None) -> None:
    """Serve the network to an MCP client over stdio (tools: ask, list_agents)."""
    from node.agents.mcp_server import serve

    serve(resolve_data_dir(data_dir))
