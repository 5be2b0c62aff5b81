"""Agents' tools: what an agent may call while it answers a task, and who may make it call them.

* ``tools``: the tool interface, the registry an agent's declared tool names build, the
  permission check (:class:`~node.agents.tools.ToolPolicy`) and the per-task bounds.
* ``calculator``, ``docsearch``: the built-in tools (both read-only).
* ``mcp_transport``, ``mcp_tools``: tools of MCP servers the operator configures.
* ``settings``: the ``[tools]`` and ``[[mcp_servers]]`` tables of node.toml.
* ``loop``: the bounded tool-calling loop that answers a task with tools.
* ``mcp_server``: ``symphony mcp``, the network served to an MCP client over stdio.
"""
