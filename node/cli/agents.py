"""`symphony agents list`: the network's agents as the running node's ledger holds them.

Only parses and prints: it asks the daemon that owns ``--data-dir`` over its local HTTP API
(``GET /agents``, node/agents/api.py). A table for humans, ``--json`` for scripts.
"""

from __future__ import annotations

import click

from node.cli.ledger import _DATA_DIR_HELP, _console, _echo_json, _get, _short


@click.group("agents")
def agents() -> None:
    """Agents on the network: what they are good at, their tools, price and node."""


@agents.command("list")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help=_DATA_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option("--skill", default=None, help="Only agents listing this skill tag.")
@click.option("--peer", default=None, help="Only this node's agents.")
def list_agents(data_dir: str | None, as_json: bool, skill: str | None, peer: str | None) -> None:
    """Every live agent card in the ledger, this node's included, best node first."""
    result = _get(data_dir, "/agents", {"skill": skill, "peer": peer})
    if as_json:
        _echo_json(result)
        return
    from rich.table import Table

    table = Table(title=f"agents: {result['count']} live")
    for col in ("agent", "node", "skills", "price/1k", "reputation", "vector"):
        table.add_column(col)
    for a in result["agents"]:
        vector = "verified" if a["vector_verified"] else "unverified" if a["has_vector"] else "-"
        table.add_row(
            a["name"],
            _short(a["peer_id"]) + (" (self)" if a["self"] else ""),
            ", ".join(a["skills"]) or "-",
            f"{a['price_per_1k_tokens']:g}",
            f"{a['reputation']:.3f}",
            vector,
        )
    console = _console()
    console.print(table)
    for a in result["agents"]:
        tools = ", ".join(t["name"] + (" (side effects)" if t["side_effects"] else "")
                          for t in a["tools"])
        console.print(f"\n{a['name']} @ {_short(a['peer_id'])}: {a['description']}\n"
                      f"  model {a['model'] or '-'}"
                      + (f" + adapter {a['adapter']}" if a["adapter"] else "")
                      + f"; tools: {tools or 'none'}", markup=False, highlight=False)
