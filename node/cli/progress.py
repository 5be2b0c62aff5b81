"""Feedback while the CLI waits: a live view of an ask, spinners for long steps.

* :func:`follow_task` polls ``GET /tasks/{id}`` (the task's snapshot) and
  ``GET /dashboard/live/{id}`` (the bids and verification verdicts the daemon saw) and keeps
  a rich ``Live`` panel up to date until the task is done or failed: phase, round, each bid,
  each chosen executor with its state and answer, a k=1 task's text as its executor streams
  it (``streamed``), then the votes. The panel is transient:
  the caller prints the final result once (node/cli/tasks.py ``print_task``).
* :func:`working` shows a spinner with the elapsed time while a long step runs (a benchmark,
  starting daemons that load and measure a model), on stderr so stdout stays clean for
  ``--json``.

Both draw only on a terminal: rich prints nothing transient when the output is a pipe or a
file, so scripts and tests see the final output alone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: how often the live view polls the daemon (seconds)
POLL_S = 0.25
#: phases of a task that is still open
OPEN_PHASES = ("bidding", "running")


def _short(peer: str | None) -> str:
    if not peer:
        return "-"
    return peer if len(peer) <= 16 else f"{peer[:8]}…{peer[-6:]}"


def task_view(snap: dict[str, Any], live: dict[str, Any], elapsed_s: float) -> Any:
    """The live panel of one task: bids, executors (with answers as they arrive), votes."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text.assemble(
        ("task ", "dim"), snap["task_id"][:16], ("  phase ", "dim"), (snap["phase"], "bold"),
        ("  round ", "dim"), str(snap.get("round", 0)), ("  k ", "dim"), str(snap["k"]),
        ("  elapsed ", "dim"), f"{elapsed_s:.1f} s")
    bids = Table(title=f"bids ({len(live.get('bids', []))})", title_justify="left")
    for col in ("bidder", "match", "price"):
        bids.add_column(col)
    for b in live.get("bids", []):
        bids.add_row(_short(b.get("peer")), str(b.get("match")), str(b.get("price")))
    answers = {r["executor"]: r for r in snap.get("results", [])}
    checks = {c["executor"]: c["outcome"] for c in live.get("verification", []) if c["final"]}
    executors = Table(title="executors", title_justify="left")
    for col in ("executor", "state", "answer", "tokens", "verification"):
        executors.add_column(col)
    for a in snap.get("attempts", []):
        result = answers.get(a["peer"], {})
        executors.add_row(_short(a["peer"]), a["state"], str(result.get("answer", "…")),
                          str(result.get("tokens", "")), checks.get(a["peer"], ""))
    parts: list[Any] = [head, bids, executors]
    if snap.get("streamed"):  # a k=1 task's tokens as its executor generates them
        parts.append(Text(snap["streamed"]))
    if snap.get("votes"):
        votes = Table(title="votes", title_justify="left")
        for col in ("answer", "count", "share"):
            votes.add_column(col)
        for v in snap["votes"]:
            votes.add_row(str(v["answer"]), str(v["count"]), f"{v['share']:.0%}")
        parts.append(votes)
    return Group(*parts)


def follow_task(get: Callable[[str], Any], task_id: str, *, timeout_s: float,
                console: Any | None = None) -> dict[str, Any]:
    """Show the task live until it ends (or ``timeout_s`` passes); its last snapshot."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console(file=sys.stdout)
    started = time.monotonic()
    snap: dict[str, Any] = get(f"/tasks/{task_id}")
    live_info: dict[str, Any] = {}
    with Live(console=console, transient=True, refresh_per_second=8) as view:
        while True:
            live_info = get(f"/dashboard/live/{task_id}")
            view.update(task_view(snap, live_info, time.monotonic() - started))
            if snap["phase"] not in OPEN_PHASES or time.monotonic() - started > timeout_s:
                return snap
            time.sleep(POLL_S)
            snap = get(f"/tasks/{task_id}")


@contextmanager
def working(description: str) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while the block runs."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    console = Console(file=sys.stderr)
    with Progress(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        progress.add_task(description, total=None)
        yield


def byte_bar(title: str, poll: Callable[[], tuple[int, int, bool]], *, timeout_s: float,
             what: str) -> None:
    """A bar of bytes (done of total, rate, time left) that polls ``poll() -> (done, total,
    finished)`` every ``POLL_S`` until it says finished; a ClickException naming ``what``
    after ``timeout_s``. On stderr, and only on a terminal (stdout stays the result's)."""
    import click
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(file=sys.stderr)
    deadline = time.monotonic() + timeout_s
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                  disable=not console.is_terminal) as bar:
        task = bar.add_task(title, total=None)
        while True:
            done, total, finished = poll()
            bar.update(task, completed=done, total=total or None)
            if finished:
                return
            if time.monotonic() > deadline:
                raise click.ClickException(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(POLL_S)
