"""`symphony relay publish|status|get`: the weight relay of the running daemon.

The commands only parse and call the daemon's local API (``/relay/...``, node/relay/api.py)
through node/control.py; progress bars poll ``GET /relay/status``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from node.cli.daemon_api import api_client, call, data_dir_option, echo_json, stdout_console

#: how often a progress bar polls the daemon
POLL_S = 0.25
FORMATS = ("raw", "safetensors", "gguf", "lora-delta")


def _version(status: dict[str, Any], version_id: str) -> dict[str, Any] | None:
    return next((v for v in status["versions"] if v["id"] == version_id), None)


@click.group("relay")
def relay() -> None:
    """Relay model weights to every peer (pipelined, verified chunk by chunk)."""


@relay.command("publish")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--name", required=True, help="Artifact name, e.g. the model name.")
@click.option("--version", type=int, default=None, help="Default: the last one + 1.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="raw", show_default=True)
@click.option("--chunk-size", type=int, default=None, help="Bytes (default: the node's).")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Show progress until every recipient has it.",
)
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True)
@data_dir_option
def publish(
    file: str,
    name: str,
    version: int | None,
    fmt: str,
    chunk_size: int | None,
    wait: bool,
    timeout_s: float,
    data_dir: str | None,
) -> None:
    """Publish FILE as the next version of NAME and relay it to the connected peers."""
    client = api_client(data_dir)
    body = {
        "path": str(Path(file).resolve()),
        "name": name,
        "version": version,
        "format": fmt,
        "chunk_size": chunk_size,
    }
    result = call(client.post, "/relay/publish", json=body)
    click.echo(
        f"published {result['name']} v{result['version']}: {result['chunks']} chunks, "
        f"{result['total_size']} bytes, id {result['id'][:16]}, "
        f"{len(result['recipients'])} recipients"
    )
    if not wait or not result["recipients"]:
        return
    recipients, chunks = result["recipients"], result["chunks"]

    def progress(status: dict[str, Any]) -> tuple[int, int]:
        v = _version(status, result["id"]) or {"peers": {}}
        held = [min(v["peers"].get(p, 0), chunks) for p in recipients]
        return sum(held), sum(h == chunks for h in held)

    _progress_bar(
        client,
        f"relaying to {len(recipients)} peers",
        chunks * len(recipients),
        progress,
        timeout_s,
        lambda done: done[1] == len(recipients),
    )
    click.echo(f"every recipient holds {name} v{result['version']}")


@relay.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the raw status JSON.")
@data_dir_option
def status(as_json: bool, data_dir: str | None) -> None:
    """Versions held or in transfer, and each peer's progress."""
    result = call(api_client(data_dir).get, "/relay/status")
    if as_json:
        echo_json(result)
        return
    from rich.table import Table

    out = stdout_console()
    table = Table(title="relay versions")
    for col in ("name", "version", "state", "held", "size", "source", "children", "peers done"):
        table.add_column(col)
    for v in result["versions"]:
        done = sum(1 for h in v["peers"].values() if h >= v["chunks"])
        table.add_row(
            v["name"],
            str(v["version"]),
            v["state"],
            f"{v['held']}/{v['chunks']}",
            f"{v['total_size'] / 1e6:.1f} MB",
            (v["source"] or "-")[-8:],
            str(len(v["children"])),
            f"{done}/{len(v['peers'])}",
        )
    out.print(table)
    out.print(
        f"in {result['bytes_in'] / 1e6:.1f} MB, out {result['bytes_out'] / 1e6:.1f} MB,"
        f" bad chunks {result['bad_chunks']}"
    )


@relay.command("get")
@click.argument("name")
@click.option("--version", type=int, default=None, help="Default: the newest complete one.")
@click.option("--out", required=True, type=click.Path(dir_okay=False))
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True)
@data_dir_option
def get(name: str, version: int | None, out: str, timeout_s: float, data_dir: str | None) -> None:
    """Write artifact NAME to --out, fetching it from peers first if needed."""
    client = api_client(data_dir)

    def held(status: dict[str, Any]) -> dict[str, Any] | None:
        done = [
            v
            for v in status["versions"]
            if v["name"] == name
            and v["state"] == "complete"
            and (version is None or v["version"] == version)
        ]
        return max(done, key=lambda v: v["version"], default=None)

    if held(call(client.get, "/relay/status")) is None:
        call(client.post, "/relay/fetch", json={"name": name})

        def progress(status: dict[str, Any]) -> tuple[int, int]:
            active = [v for v in status["versions"] if v["name"] == name]
            newest = max(active, key=lambda v: v["version"], default=None)
            if newest is None:
                return 0, 0
            return newest["held"], newest["chunks"]

        _progress_bar(
            client,
            f"fetching {name}",
            None,
            progress,
            timeout_s,
            lambda _: held(call(client.get, "/relay/status")) is not None,
        )
    result = call(
        client.post,
        "/relay/export",
        json={"name": name, "version": version, "out": str(Path(out).resolve())},
    )
    click.echo(
        f"wrote {result['name']} v{result['version']} ({result['size']} bytes) to {result['out']}"
    )


def _progress_bar(
    client: Any, title: str, total: int | None, progress: Any, timeout_s: float, finished: Any
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    deadline = time.monotonic() + timeout_s
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ) as bar:
        task = bar.add_task(title, total=total)
        while True:
            done = progress(call(client.get, "/relay/status"))
            if total is None and done[1]:
                bar.update(task, total=done[1])
            bar.update(task, completed=done[0])
            if finished(done):
                return
            if time.monotonic() > deadline:
                raise click.ClickException(f"timed out after {timeout_s} s ({title})")
            time.sleep(POLL_S)
