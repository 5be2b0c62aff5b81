"""`symphony simulate SCENARIO [--nodes N] [--seed S] [--out DIR] [--json] [--scheduler URL]`.

Parses, loads the scenario (a shipped name like ``ledger`` or a path to a TOML file), applies
the overrides and hands it to simulations/runner/run.py, with a rich progress bar on stderr.
Writes DIR/report.json and DIR/report.html and prints the headline figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command()
@click.argument("scenario")
@click.option(
    "--nodes",
    type=int,
    default=None,
    help="Run this many nodes (instead of the scenario's sweep of sizes).",
)
@click.option("--seed", type=int, default=None, help="Random seed (default: the scenario's).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Report directory (default: out/<scenario name>).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the headline as one JSON object.")
@click.option(
    "--scheduler",
    default=None,
    metavar="tcp://HOST:PORT",
    help="Run the sweep's points on the Dask cluster whose scheduler listens there (ledger).",
)
def simulate(
    scenario: str,
    nodes: int | None,
    seed: int | None,
    out_dir: str | None,
    as_json: bool,
    scheduler: str | None,
) -> None:
    """Simulate SCENARIO (ledger, voting, voting-real, routing, verification, relay, membership,
    distributed, rl, agents, or a .toml file; voting-real answers with the real model, see
    [compute] in simulations/scenario.py; distributed takes --nodes as its stage count, rl as
    its worker count; agents routes tasks to agents by score and by LinUCB, plans answers the
    shipped word problems in plan mode; these two write no report files)."""
    if scenario in ("agents", "plans"):
        _simulate_agents(scenario, 0 if seed is None else seed, as_json)
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from simulations.runner.run import run_and_write
    from simulations.scenario import ScenarioError, load

    if scheduler is not None and not scheduler.startswith("tcp://"):
        raise click.BadParameter("expected tcp://HOST:PORT", param_hint="--scheduler")
    try:
        sc = load(scenario).with_overrides(nodes=nodes, seed=seed)
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from None
    out = Path(out_dir) if out_dir else Path("out") / sc.name
    err = Console(file=sys.stderr)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(f"simulate {sc.name}", total=1.0)

        def progress(fraction: float, label: str) -> None:
            bar.update(task, completed=fraction, description=f"{sc.name}: {label}")

        try:
            report, wall_s, json_path, html_path = run_and_write(sc, out, progress, scheduler)
        except ScenarioError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report.headline, sort_keys=True))
        return
    table = Table(title=f"symphony simulate {sc.name} (seed {sc.seed})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in report.headline.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console(file=sys.stdout).print(table)
    click.echo(f"{report.question}")
    click.echo(f"report: {json_path}  page: {html_path}  ({wall_s:.1f} s)")


def _simulate_agents(scenario: str, seed: int, as_json: bool) -> None:
    """`symphony simulate agents|plans`: simulations/agents/, printed as one JSON object or a
    table."""
    from rich.console import Console
    from rich.table import Table

    from simulations.agents import run_agents_scenario
    from simulations.agents.plans import run_plans_scenario

    report = (run_plans_scenario if scenario == "plans" else run_agents_scenario)(seed)
    if as_json:
        click.echo(json.dumps(report, sort_keys=True))
        return
    table = Table(title=f"symphony simulate {scenario} (seed {seed})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in report.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    Console(file=sys.stdout).print(table)
