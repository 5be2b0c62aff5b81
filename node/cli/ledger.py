"""`symphony ledger peers|show|attestations`: the running node's view of the gossip ledger.

The commands only parse and print: they ask the daemon that owns ``--data-dir`` over its local
HTTP API (``GET /ledger/...``, node/ledger/api.py). Tables for humans, ``--json`` for scripts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import click

_DATA_DIR_HELP = "Data directory (default: $SYMPHONY_DATA_DIR or ~/.symphony)."


def _get(data_dir: str | None, path: str, params: dict[str, Any] | None = None) -> Any:
    import httpx

    from node.config import default_data_dir
    from node.control import ApiClient, DaemonNotRunning

    directory = Path(data_dir).expanduser() if data_dir else default_data_dir()
    query = urlencode({k: v for k, v in (params or {}).items() if v not in (None, "")})
    try:
        return ApiClient(directory).get(path + (f"?{query}" if query else ""))
    except DaemonNotRunning as exc:
        raise click.ClickException(str(exc)) from None
    except httpx.HTTPStatusError as exc:
        try:
            message = exc.response.json().get("error", exc.response.text)
        except ValueError:
            message = exc.response.text
        raise click.ClickException(f"{exc.response.status_code}: {message}") from None


def _ago(now_ms: int, at_ms: int | None) -> str:
    if at_ms is None:
        return ""
    return f"{max(0, now_ms - at_ms) / 1000:.0f} s ago"


def _short(peer: str) -> str:
    return peer if len(peer) <= 16 else f"{peer[:8]}…{peer[-6:]}"


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


def _console() -> Any:
    from rich.console import Console

    return Console(file=sys.stdout)


@click.group("ledger")
def ledger() -> None:
    """Who is out there, what they serve, how far to trust them."""


@ledger.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help=_DATA_DIR_HELP)
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
    result = _get(data_dir, "/ledger/peers", {"model": model, "role": role, "sort": sort})
    if as_json:
        _echo_json(result)
        return
    from rich.table import Table

    now = result["now_ms"]
    table = Table(title=f"ledger: {len(result['peers'])} live peers")
    for col in ("peer", "models", "tok/s", "price/1k", "load", "reputation", "roles", "last seen"):
        table.add_column(col)
    for p in result["peers"]:
        models = p["models"]
        table.add_row(
            _short(p["peer_id"]) + (" (self)" if p["self"] else ""),
            ", ".join(m["name"] for m in models) or "-",
            ", ".join(f"{m['tokens_per_s']:.1f}" for m in models) or "-",
            f"{p['price_per_1k_tokens']:g}",
            f"{p['max_slots'] - p['free_slots']}/{p['max_slots']}",
            f"{p['reputation']['score']:.3f} ({p['reputation']['evidence']})",
            ",".join(p["roles"]),
            _ago(now, p["last_seen_ms"]),
        )
    _console().print(table)


@ledger.command()
@click.argument("peer")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help=_DATA_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def show(peer: str, data_dir: str | None, as_json: bool) -> None:
    """One peer's capability record, reputation and the attestations about it."""
    result = _get(data_dir, f"/ledger/peers/{quote(peer, safe='')}")
    if as_json:
        _echo_json(result)
        return
    console = _console()
    rec, rep = result["record"], result["reputation"]
    console.print(f"peer        {result['peer_id']}  ({'live' if result['live'] else 'not live'})")
    console.print(
        f"reputation  {rep['score']:.3f}  (successes {rep['successes']:.2f}, failures "
        f"{rep['failures']:.2f}, {rep['observers']} observers, {rep['evidence']} attestations)"
    )
    if rec is not None:
        console.print(
            f"seq         {rec['seq']}  expires in "
            f"{(rec['expires_at_ms'] - result['now_ms']) / 1000:.0f} s"
        )
        console.print(
            f"price/1k    {rec['price_per_1k_tokens']:g}   slots "
            f"{rec['free_slots']}/{rec['max_slots']} free   load {rec['load']:.2f}"
        )
        console.print(f"roles       {', '.join(rec['roles'])}   tags {', '.join(rec['tags'])}")
        hw = rec["hardware"]
        console.print(
            f"hardware    {hw['device_kind']} {hw['device_name']}, "
            f"{hw['memory_bytes'] / 2**30:.1f} GiB, {hw['cpu_cores']} cores"
        )
        for m in rec["models"]:
            console.print(
                f"model       {m['name']} ({m['family']}, {m['quantization'] or '-'}, "
                f"ctx {m['context_length']}) {m['tokens_per_s']:.1f} tok/s"
            )
        for addr in rec["listen_addrs"]:
            console.print(f"address     {addr}")
    _print_attestations(result["attestations"][:20], result["now_ms"])


@ledger.command()
@click.option("--peer", default=None, help="Only attestations about this peer.")
@click.option("--kind", default=None, help="Only this kind (e.g. verification_failed).")
@click.option("--limit", type=int, default=50)
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help=_DATA_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def attestations(
    peer: str | None, kind: str | None, limit: int, data_dir: str | None, as_json: bool
) -> None:
    """Signed attestations held by the node, newest first."""
    result = _get(data_dir, "/ledger/attestations", {"peer": peer, "kind": kind, "limit": limit})
    if as_json:
        _echo_json(result)
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
            _short(a["observer"]),
            _short(a["subject"]),
            a["kind"],
            a["object_id"][:16],
            a["outcome"],
        )
    _console().print(table)
