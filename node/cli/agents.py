"""`symphony agents list`: the network's agents as the running node's ledger holds them.

Only parses and prints: it asks the daemon that owns ``--data-dir`` over its local HTTP API
(``GET /agents``, node/agents/api.py). A table for humans, ``--json`` for scripts.
"""

from __future__ import annotations

import click

from node.cli.daemon_api import data_dir_option, echo_json, get, short_peer, stdout_console


@click.group("agents")
def agents() -> None:
    """Agents on the network: what they are good at, their tools, price and node."""


@agents.command("list")
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option("--skill", default=None, help="Only agents listing this skill tag.")
@click.option("--peer", default=None, help="Only this node's agents.")
def list_agents(data_dir: str | None, as_json: bool, skill: str | None, peer: str | None) -> None:
    """Every live agent card in the ledger, this node's included, best node first."""
    result = get(data_dir, "/agents", {"skill": skill, "peer": peer})
    if as_json:
        echo_json(result)
        return
    from rich.table import Table

    table = Table(title=f"agents: {result['count']} live")
    for col in ("agent", "node", "skills", "price/1k", "reputation", "vector"):
        table.add_column(col)
    for a in result["agents"]:
        vector = "verified" if a["vector_verified"] else "unverified" if a["has_vector"] else "-"
        table.add_row(
            a["name"],
            short_peer(a["peer_id"]) + (" (self)" if a["self"] else ""),
            ", ".join(a["skills"]) or "-",
            f"{a['price_per_1k_tokens']:g}",
            f"{a['reputation']:.3f}",
            vector,
        )
    out = stdout_console()
    out.print(table)
    for a in result["agents"]:
        tools = ", ".join(t["name"] + (" (side effects)" if t["side_effects"] else "")
                          for t in a["tools"])
        out.print(f"\n{a['name']} @ {short_peer(a['peer_id'])}: {a['description']}\n"
                  f"  model {a['model'] or '-'}"
                  + (f" + adapter {a['adapter']}" if a["adapter"] else "")
                  + f"; tools: {tools or 'none'}", markup=False, highlight=False)
