"""`symphony model pull NAME|HASH`: a model's GGUF from the peers that serve it.

The command only parses and calls the daemon's local API (``POST /relay/pull``, then
``GET /relay/status`` for the bar, then ``POST /relay/export``; node/relay/models.py does the
work): the daemon asks every peer whose ledger record offers the model, fetches chunks from all
of them at once, checks each chunk as it arrives and the whole file against the weights hash
the ledger names. Chunks are kept as they arrive: a pull interrupted (the daemon killed, the
command stopped) continues where it stopped when run again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from node.cli.daemon_api import api_client, call, data_dir_option
from node.cli.progress import byte_bar


@click.group("model")
def model() -> None:
    """Models from peers."""


def _versions(status: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [v for v in status["versions"] if v["name"] == name]


@model.command("pull")
@click.argument("model_ref", metavar="NAME|HASH")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Where to write the GGUF (default: ./NAME.gguf).")
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True)
@data_dir_option
def pull(model_ref: str, out: str | None, timeout_s: float, data_dir: str | None) -> None:
    """Fetch model NAME (or the file with weights hash HASH) from the peers that serve it."""
    client = api_client(data_dir)
    started = call(client.post, "/relay/pull", json={"model": model_ref})
    name = started["name"]
    state: dict[str, Any] = {}

    def poll() -> tuple[int, int, bool]:
        status = call(client.get, "/relay/status")
        versions = _versions(status, name)
        if name in status.get("rejected", {}) and not versions:  # no other content left
            raise click.ClickException(f"{model_ref} rejected: {status['rejected'][name]}")
        done = [v for v in versions if v["state"] == "complete" and v["verified"]]
        if done:
            state["version"] = done[0]
            return done[0]["total_size"], done[0]["total_size"], True
        if not versions:
            return 0, 0, False
        v = max(versions, key=lambda v: v["held"])
        return min(v["held"] * v["chunk_size"], v["total_size"]), v["total_size"], False

    holders = len(started["holders"])
    byte_bar(f"{model_ref[:24]} from {holders} peers", poll, timeout_s=timeout_s,
             what=f"{model_ref} from {holders} peers")
    target = Path(out) if out else Path(f"{model_ref if len(model_ref) < 64 else name[:16]}.gguf")
    result = call(client.post, "/relay/export",
                  json={"name": name, "out": str(target.resolve())})
    click.echo(f"pulled {model_ref} ({result['size']} bytes, weights hash {name}) "
               f"from {holders} peers to {result['out']}")
