"""`symphony doctor [--json]`: check a node's set-up, running or stopped, and say how to fix it.

Builds the node's Config as ``symphony node run`` would (flag > env > TOML > defaults), runs
node/doctor/run.py's checks and prints one line per check (a table; ``--json``: one object with
``checks`` and ``summary``). The exit status is 1 when any check failed, else 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from node.config import ConfigError
from node.doctor.report import Check


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Data directory (default: $SYMPHONY_DATA_DIR or ~/.symphony).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (default: <data-dir>/node.toml if present).")
@click.option("--listen", multiple=True, help="As for `symphony node run` (repeatable).")
@click.option("--bootstrap", multiple=True, help="As for `symphony node run` (repeatable).")
@click.option("--network-id", default=None, help="As for `symphony node run`.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: checks and summary.")
@click.option("--skip-model", is_flag=True, help="Do not load and time the model.")
def doctor(config_file: str | None, as_json: bool, skip_model: bool, **flags: Any) -> None:
    """Check this node: key, data dir, ports, bootstrap peers, model, disk, GPU, NAT, clock.

    Takes the flags `symphony node run` was given (they override node.toml as they do there);
    a running daemon is judged by the settings it was started with, flags included, unless
    given here. Exits with status 1 when any check fails.
    """
    from node.config import load_config
    from node.daemon import config_sections, load_service_classes
    from node.doctor.report import failed, summary
    from node.doctor.run import run_doctor
    from node.logs import configure_logging

    try:
        config = load_config(flags, config_file=Path(config_file) if config_file else None,
                             sections=config_sections(load_service_classes()))
    except ConfigError as exc:
        raise click.ClickException(f"the config does not load: {exc}") from None
    configure_logging("warning")  # the probes' transport logs go to stderr, and only trouble
    given = [key for key, value in flags.items() if value not in (None, ())]
    checks = run_doctor(config, check_model=not skip_model, given=given)
    if as_json:
        click.echo(json.dumps({"checks": [c.as_json() for c in checks],
                               "summary": summary(checks)}, sort_keys=True))
    else:
        _print(checks, summary(checks))
    sys.exit(1 if failed(checks) else 0)


def _print(checks: list[Check], counts: dict[str, int]) -> None:
    from rich.console import Console
    from rich.markup import escape

    marks = {"pass": "[green]pass[/]", "fail": "[bold red]FAIL[/]", "warn": "[yellow]warn[/]",
             "skip": "[dim]skip[/]"}
    console = Console(file=sys.stdout, highlight=False)
    for c in checks:
        console.print(f"{marks[c.status]}  [bold]{escape(c.name)}[/]: {escape(c.detail)}")
        if c.fix:
            console.print(f"      fix: {escape(c.fix)}")
    console.print(", ".join(f"{n} {status}" for status, n in counts.items() if n))
