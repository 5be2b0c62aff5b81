"""`symphony ledger peers|show|attestations`: the running node's view of the gossip ledger.

The commands only parse and print: they ask the daemon that owns ``--data-dir`` over its local
HTTP API (``GET /ledger/...``, node/ledger/api.py). Tables for humans, ``--json`` for scripts.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import click

from node.cli.daemon_api import data_dir_option, echo_json, get, short_peer, stdout_console


def _ago(now_ms: int, at_ms: int | None) -> str:
    if at_ms is None:
        return ""
    return f"{max(0, now_ms - at_ms) / 1000:.0f} s ago"


@click.group("ledger")
def ledger() -> None:
    """Who is out there, what they serve, how far to trust them."""


@ledger.command()
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option("--model", default=None, help="Only peers serving this model.")
@click.option("--role", default=None, help="Only peers offering this role.")
@click.option(
    "--sort", default="reputation", help="reputation, tokens_per_s, price, free_slots, load."
)
def peers(
    data_dir: str | None, as_json: bool, model: str | None, role: str | None, sort: str
) -> None:
    """Every live node in the ledger, this one included."""
    result = get(data_dir, "/ledger/peers", {"model": model, "role": role, "sort": sort})
    if as_json:
        echo_json(result)
        return
    from rich.table import Table

    now = result["now_ms"]
    table = Table(title=f"ledger: {len(result['peers'])} live peers")
    for col in ("peer", "models", "tok/s", "price/1k", "load", "reputation", "roles", "last seen"):
        table.add_column(col)
    for p in result["peers"]:
        models = p["models"]
        table.add_row(
            short_peer(p["peer_id"]) + (" (self)" if p["self"] else ""),
            ", ".join(m["name"] for m in models) or "-",
            ", ".join(f"{m['tokens_per_s']:.1f}" for m in models) or "-",
            f"{p['price_per_1k_tokens']:g}",
            f"{p['max_slots'] - p['free_slots']}/{p['max_slots']}",
            f"{p['reputation']['score']:.3f} ({p['reputation']['evidence']})",
            ",".join(p["roles"]),
            _ago(now, p["last_seen_ms"]),
        )
    stdout_console().print(table)


@ledger.command()
@click.argument("peer")
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def show(peer: str, data_dir: str | None, as_json: bool) -> None:
    """One peer's capability record, reputation and the attestations about it."""
    result = get(data_dir, f"/ledger/peers/{quote(peer, safe='')}")
    if as_json:
        echo_json(result)
        return
    out = stdout_console()
    rec, rep = result["record"], result["reputation"]
    out.print(f"peer        {result['peer_id']}  ({'live' if result['live'] else 'not live'})")
    out.print(
        f"reputation  {rep['score']:.3f}  (successes {rep['successes']:.2f}, failures "
        f"{rep['failures']:.2f}, {rep['observers']} observers, {rep['evidence']} attestations)"
    )
    if rec is not None:
        out.print(
            f"seq         {rec['seq']}  expires in "
            f"{(rec['expires_at_ms'] - result['now_ms']) / 1000:.0f} s"
        )
        out.print(
            f"price/1k    {rec['price_per_1k_tokens']:g}   slots "
            f"{rec['free_slots']}/{rec['max_slots']} free   load {rec['load']:.2f}"
        )
        out.print(f"roles       {', '.join(rec['roles'])}   tags {', '.join(rec['tags'])}")
        hw = rec["hardware"]
        out.print(
            f"hardware    {hw['device_kind']} {hw['device_name']}, "
            f"{hw['memory_bytes'] / 2**30:.1f} GiB, {hw['cpu_cores']} cores"
        )
        for m in rec["models"]:
            out.print(
                f"model       {m['name']} ({m['family']}, {m['quantization'] or '-'}, "
                f"ctx {m['context_length']}) {m['tokens_per_s']:.1f} tok/s"
            )
        for addr in rec["listen_addrs"]:
            out.print(f"address     {addr}")
    _print_attestations(result["attestations"][:20], result["now_ms"])


@ledger.command()
@click.option("--peer", default=None, help="Only attestations about this peer.")
@click.option("--kind", default=None, help="Only this kind (e.g. verification_failed).")
@click.option("--limit", type=int, default=50)
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def attestations(
    peer: str | None, kind: str | None, limit: int, data_dir: str | None, as_json: bool
) -> None:
    """Signed attestations held by the node, newest first."""
    result = get(data_dir, "/ledger/attestations", {"peer": peer, "kind": kind, "limit": limit})
    if as_json:
        echo_json(result)
        return
    _print_attestations(result["attestations"], int(time.time() * 1000), total=result["count"])


def _print_attestations(atts: list[dict[str, Any]], now_ms: int, total: int | None = None) -> None:
    from rich.table import Table

    shown = f"{len(atts)}" + (f" of {total}" if total is not None else "")
    table = Table(title=f"attestations ({shown})")
    for col in ("observed", "observer", "subject", "kind", "object", "outcome"):
        table.add_column(col)
    for a in atts:
        table.add_row(
            _ago(now_ms, a["observed_at_ms"]),
            short_peer(a["observer"]),
            short_peer(a["subject"]),
            a["kind"],
            a["object_id"][:16],
            a["outcome"],
        )
    stdout_console().print(table)
