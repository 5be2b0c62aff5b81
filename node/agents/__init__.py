"""Agents: the agents a node hosts, the network's agents it knows, and the tools they call.

* ``config``: the ``[[agents]]`` tables of node.toml, and the agents this node hosts.
* ``cards``: this node's agent cards (embedded, quantized, signed, published by the ledger).
* ``checks``: the receiving side's check that a card's vector is its own description's.
* ``api``: ``GET /agents`` on the daemon's HTTP API.
* ``tools``: the tool interface, the registry an agent's declared tool names build, the
  permission check (:class:`~node.agents.tools.ToolPolicy`) and the per-task bounds.
* ``calculator``, ``docsearch``: the built-in tools (both read-only).
* ``mcp_transport``, ``mcp_tools``: tools of MCP servers the operator configures.
* ``settings``: the ``[tools]`` and ``[[mcp_servers]]`` tables of node.toml.
* ``loop``: the bounded tool-calling loop that answers a task with tools.
* ``hosted``: the agents this node hosts in the task market, their cards, and an agent's
  tool calls for an assigned task.
* ``mcp_server``: ``symphony mcp``, the network served to an MCP client over stdio.
"""
