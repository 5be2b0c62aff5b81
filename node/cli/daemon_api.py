"""What the commands that talk to the local daemon share: the ``--data-dir`` option, the
daemon's API client, one way to turn its errors into a usage error, and the output helpers.

A command only parses and prints: the daemon that owns the data directory does the work and
answers over its local HTTP API (node/control.py). A daemon that is not running, or one that
refuses a call, ends the command with a ``click.ClickException`` that says why (the daemon's
own words for a refusal), never a traceback. Tables are for people, ``--json`` for scripts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import click

from node.config import default_data_dir

if TYPE_CHECKING:
    from rich.console import Console

    from node.control import ApiClient

DATA_DIR_HELP = "Data directory (default: $SYMPHONY_DATA_DIR or ~/.symphony)."

#: the ``--data-dir`` option of every command that works on a node's data directory
data_dir_option = click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                               help=DATA_DIR_HELP)


def resolve_data_dir(value: str | None) -> Path:
    """The directory ``--data-dir`` names, else $SYMPHONY_DATA_DIR, else ~/.symphony."""
    return Path(value).expanduser() if value else default_data_dir()


def api_client(value: str | None, timeout_s: float = 10.0) -> ApiClient:
    """The API client of the daemon that owns data directory ``value``."""
    from node.control import ApiClient, DaemonNotRunning

    try:
        return ApiClient(resolve_data_dir(value), timeout_s=timeout_s)
    except DaemonNotRunning as exc:
        raise click.ClickException(str(exc)) from None


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, one of an ApiClient's calls; the daemon gone or refusing
    becomes a ClickException."""
    import httpx

    from node.control import DaemonNotRunning, refusal

    try:
        return fn(*args, **kwargs)
    except DaemonNotRunning as exc:
        raise click.ClickException(str(exc)) from None
    except httpx.HTTPStatusError as exc:
        raise click.ClickException(
            f"the daemon refused ({exc.response.status_code}): {refusal(exc)}") from None


def get(value: str | None, path: str, params: dict[str, Any] | None = None) -> Any:
    """``GET path`` of the daemon of data directory ``value``, with the ``params`` that are
    set (None and "" are left out) as its query."""
    query = urlencode({k: v for k, v in (params or {}).items() if v not in (None, "")})
    return call(api_client(value).get, path + (f"?{query}" if query else ""))


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True))


def stdout_console() -> Console:
    from rich.console import Console

    return Console(file=sys.stdout)


def short_peer(peer: str | None) -> str:
    """A peer id cut to its ends for a table column ("-" for none)."""
    if not peer:
        return "-"
    return peer if len(peer) <= 16 else f"{peer[:8]}…{peer[-6:]}"
