"""The `symphony` command line.

The CLI only parses: each command builds a frozen config or a request and hands it to the code
that does the work. Subcommands live in their own modules and are imported lazily, so
``symphony --help`` does not pay for libp2p, torch or llama.cpp.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from node.cli.options import LINK_SPEC

#: command name -> "module:attribute" of a click command or group.
SUBCOMMANDS: dict[str, str] = {
    "keygen": "node.cli.node:keygen",
    "node": "node.cli.node:node_group",
    "demo": "node.cli.node:demo",
    "testnet": "node.cli.node:testnet",
    "bench": "node.cli.main:bench",
    "ask": "node.cli.tasks:ask",
    "tasks": "node.cli.tasks:tasks",
    "ledger": "node.cli.ledger:ledger",
    "agents": "node.cli.agents:agents",
    "relay": "node.cli.relay:relay",
    "model": "node.cli.model:model",
    "simulate": "node.cli.simulate:simulate",
    "doctor": "node.cli.doctor:doctor",
    "invite": "node.cli.invite:invite",
    "join": "node.cli.invite:join",
    "rl": "node.cli.rl:rl",
    "generate": "node.cli.generate:generate",
    "mcp": "node.cli.mcp:mcp",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attr)
        return command


@click.group(cls=LazyGroup)
@click.version_option(package_name="symphony-node")
def main() -> None:
    """symphony: a peer-to-peer network of AI agents."""


def concurrency_levels(ctx: click.Context, param: click.Parameter,
                       value: str | None) -> str | None:
    """``--concurrency`` checked as it is parsed (node/bench/tasks/concurrency.py)."""
    if value is None:
        return None
    from node.bench.tasks.concurrency import parse_levels

    try:
        parse_levels(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    return value


@click.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object of named figures.")
@click.option("--quick", is_flag=True, help="A smaller run, under a minute.")
@click.option("--frames", type=click.IntRange(min=1), default=None,
              help="fuzz: frames per protocol (default 100,000).")
@click.option("--cycles", type=click.IntRange(min=1), default=None,
              help="soak: kill-and-restart cycles (default 100).")
@click.option("--honest", type=click.IntRange(min=1), default=None,
              help="verify: honest verifications for the false-positive bound "
                   "(default 2,000; 20 with --quick).")
@click.option("--link", type=LINK_SPEC, default=None,
              help="tasks, distributed, relay, ledger: run every daemon behind this link, "
                   "e.g. rtt=60ms,up=20mbit (node/p2p/link.py).")
@click.option("--concurrency", default=None, metavar="N,...", callback=concurrency_levels,
              help="tasks: instead of the load test, N users at once at each level (e.g. "
                   "1,4,16), beside llama.cpp's llama-server.")
@click.option("--model", default=None, metavar="NAME|PATH",
              help="gpu: time this model instead of the default one; agents: run the "
                   "daemons on this model (a .gguf path or registry name).")
@click.option("--only", default=None, metavar="PART,...",
              help="gpu: run only these parts (llama, torch, verify, chain); verify: (tasks, "
                   "swaps, honest, stages).")
@click.option("--seed", type=click.IntRange(0, (1 << 63) - 1), default=None,
              help="agents: the seed every ask sends (default 0).")
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="scale: light daemons to start (at most 200; default 100, 5 with --quick); "
                   "simulate: virtual nodes (at least 2; default 10,000, 2,000 with --quick).")
def bench(name: str, as_json: bool, quick: bool, **options: Any) -> None:
    """Run benchmark NAME and print its figures."""
    from node.bench import load

    given = bench_options(name, options)
    from node.cli.progress import working

    with working(f"bench {name}{' --quick' if quick else ''}"):
        figures = load(name)(quick, **given)
    if as_json:
        click.echo(json.dumps(figures, sort_keys=True))
    else:
        print_figures(name, figures)


#: ``--nodes`` per benchmark: scale starts that many real daemons (bounded by this machine's
#: memory), simulate needs two nodes for a network
NODES_RANGE: dict[str, tuple[int, int | None]] = {"scale": (1, 200), "simulate": (2, None)}


def bench_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments benchmark ``name``'s ``run`` gets from the options given (those
    not None); an unknown benchmark, or an option it does not take, is a usage error."""
    from node.bench import BENCHMARKS, OPTIONS

    if name not in BENCHMARKS:
        raise click.BadParameter(
            f"unknown benchmark {name!r}; choose from {', '.join(sorted(BENCHMARKS))}",
            param_hint="NAME",
        )
    given = {k: v for k, v in options.items() if v is not None}
    for option in given:
        if option not in OPTIONS.get(name, ()):
            takers = ", ".join(n for n, opts in sorted(OPTIONS.items()) if option in opts)
            raise click.BadParameter(f"--{option} applies only to: {takers}",
                                     param_hint=f"--{option}")
    nodes = given.get("nodes")
    low, high = NODES_RANGE.get(name, (1, None))
    if nodes is not None and (nodes < low or (high is not None and nodes > high)):
        span = f"{low} to {high}" if high is not None else f"at least {low}"
        raise click.BadParameter(f"{name} takes {span} nodes, not {nodes}", param_hint="--nodes")
    return given


def print_figures(title: str, figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"symphony bench {title}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, text)
    Console(file=sys.stdout).print(table)
