"""`symphony rl ...`: reinforcement learning on the network.

``rl plan`` prints the capacity rule (protocol/rl/capacity.py) for a given swarm: whether N
workers at r rollouts/s each feed a learner that uses B rollouts per T-second step
(``N r >= B / T``), and the smallest staleness bound that hides dissemination and generation
(``S >= ceil((dissemination + generation) / T)``).

``rl eval [--adapter A]`` scores the held-out prompts of an environment (models/rl/heldout.py)
under the base model and an adapter, same seeds, each accuracy with its 95% interval.

``rl publish ADAPTER`` relays a trained adapter for agents to run (node/cli/rl_publish.py).

``rl train --config rl.toml`` runs a GRPO learner on this machine with local rollout workers
(node/rl/learner.py): the same job book and worker function as on the network.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from node.cli.rl_publish import publish


@click.group()
def rl() -> None:
    """Reinforcement learning: rollout jobs on the network feeding a learner."""


rl.add_command(publish)


@rl.command()
@click.option("--workers", type=click.IntRange(min=0), required=True, help="Workers N.")
@click.option("--rollouts-per-s", "rate", type=float, required=True,
              help="Rollouts (completions) per second one worker produces, r.")
@click.option("--batch", type=click.IntRange(min=1), required=True,
              help="Rollouts the learner uses per step, B.")
@click.option("--step-s", type=float, required=True, help="Seconds per learner step, T.")
@click.option("--dissemination-s", type=float, default=0.0, show_default=True,
              help="Seconds for a new policy version to reach the workers (the relay).")
@click.option("--generation-s", type=float, default=None,
              help="Seconds one job takes on a worker (default: group / rollouts-per-s).")
@click.option("--group", type=click.IntRange(min=1), default=8, show_default=True,
              help="Completions per job, G (used for the default generation time).")
@click.option("--staleness", type=click.IntRange(min=0), default=0, show_default=True,
              help="The staleness bound S to check.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(workers: int, rate: float, batch: int, step_s: float, dissemination_s: float,
         generation_s: float | None, group: int, staleness: int, as_json: bool) -> None:
    """Print the capacity rule's figures for a swarm."""
    from protocol.rl.capacity import CapacityInputs
    from protocol.rl.capacity import plan as capacity_plan

    if not rate > 0:
        raise click.BadParameter(f"must be > 0, got {rate}", param_hint="--rollouts-per-s")
    generation = group / rate if generation_s is None else generation_s
    inputs = CapacityInputs(workers=workers, rollouts_per_s=rate, batch=batch, step_s=step_s,
                            dissemination_s=dissemination_s, generation_s=generation,
                            staleness=staleness)
    try:
        p = capacity_plan(inputs)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    figures = {
        "supply_per_s": p.supply_per_s, "demand_per_s": p.demand_per_s,
        "throughput_ok": p.throughput_ok, "min_workers": p.min_workers,
        "generation_s": generation, "min_staleness": p.min_staleness,
        "staleness": staleness, "staleness_ok": p.staleness_ok,
        "busy_bound": p.busy_bound, "holds": p.holds,
    }
    if as_json:
        click.echo(json.dumps(figures, sort_keys=True))
        return
    _print(figures, workers, rate, batch, step_s, dissemination_s)


def _print(f: dict[str, object], workers: int, rate: float, batch: int, step_s: float,
           dissemination_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    ok = {True: "yes", False: "NO"}
    table = Table(title="symphony rl plan: the capacity rule")
    table.add_column("rule")
    table.add_column("figures", justify="right")
    table.add_column("holds")
    table.add_row("N r >= B / T",
                  f"{workers} x {rate:.4g} = {f['supply_per_s']:.4g}/s vs "
                  f"{batch} / {step_s:.4g} = {f['demand_per_s']:.4g}/s",
                  ok[bool(f["throughput_ok"])])
    table.add_row("S >= ceil((D + gen) / T)",
                  f"S = {f['staleness']} vs ceil(({dissemination_s:.4g} + "
                  f"{f['generation_s']:.4g}) / {step_s:.4g}) = {f['min_staleness']}",
                  ok[bool(f["staleness_ok"])])
    table.add_row("fewest workers at this r", str(f["min_workers"]), "")
    table.add_row("learner busy at most", f"{f['busy_bound']:.0%}", "")
    Console(file=sys.stdout).print(table)
    if not f["holds"]:
        click.echo("The learner will wait for rollouts: add workers or raise S as shown.")


@rl.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              default=None, help="rl.toml (keys: see node/rl/learner_config.py).")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Steps to train.")
@click.option("--staleness", type=click.IntRange(min=0), default=None,
              help="Staleness bound S (0 = synchronous).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Local rollout worker processes.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Run directory (adapters, checkpoints, versions, steps.jsonl).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--network", is_flag=True,
              help="Rollout jobs through this node's daemon ([rl_jobs]) to the network's "
                   "workers, adapters through the weight relay, instead of local workers.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="With --network: the daemon's data directory (default: the usual one).")
def train(config_path: str | None, steps: int | None, staleness: int | None,
          workers: int | None, out_dir: str | None, as_json: bool, network: bool,
          data_dir: str | None) -> None:
    """Train the policy with GRPO on local rollout workers (resumes from the run directory)."""
    from node.rl.learner import run_training, summary
    from node.rl.learner_config import load_config

    try:
        config = load_config(config_path, steps=steps, staleness=staleness, workers=workers,
                             out_dir=out_dir)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from None

    def progress(stats: object) -> None:
        if not as_json:
            click.echo(json.dumps(_fields(stats)), err=True)  # one line per step, on stderr

    if network:
        figures = _train_network(config, data_dir, progress)
    else:
        try:
            report = run_training(config, on_step=progress)
        except (RuntimeError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        if report.follower_steps is not None:  # a torchrun rank other than 0: rank 0 reports the run
            return
        figures = summary(report)
    if as_json:
        click.echo(json.dumps(figures, sort_keys=True))
        return
    from node.cli.main import print_figures

    print_figures("rl train", figures)


def _train_network(config: Any, data_dir: str | None, progress: Any) -> dict[str, Any]:
    from node.cli.daemon_api import resolve_data_dir
    from node.control import DaemonNotRunning
    from node.rl.network_learner import run_network

    path = resolve_data_dir(data_dir)
    try:
        return run_network(config, path, on_step=progress)
    except (DaemonNotRunning, RuntimeError, ValueError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None


def _fields(stats: object) -> dict[str, object]:
    from dataclasses import asdict, is_dataclass

    data = asdict(stats) if is_dataclass(stats) and not isinstance(stats, type) else {}
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in data.items()}


@rl.command("eval")
@click.option("--adapter", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A LoRA adapter GGUF (an `rl train` run's adapters/<sha256>.gguf).")
@click.option("--environment", default="arith", show_default=True,
              help="'arith', 'evalset', 'evalset-cot' or 'package.module:factory'.")
@click.option("--model", default="", help="Base model (registry name or .gguf); default: "
              "the embedded default model.")
@click.option("--prompts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Held-out prompts to answer (0 = all).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0, max=4.0), default=0.0,
              show_default=True, help="0 = greedy, one answer per prompt.")
@click.option("--samples", type=click.IntRange(min=1), default=4, show_default=True,
              help="Answers per prompt when the temperature is above 0 (same seeds for both).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="llama.cpp threads.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def eval_(adapter: str | None, environment: str, model: str, prompts: int, max_tokens: int,
          temperature: float, samples: int, seed: int, threads: int, as_json: bool) -> None:
    """Accuracy on the held-out prompts (never trained on), base model and adapter."""
    from pathlib import Path

    from models.rl.env import load_heldout
    from models.rl.heldout import EvalSettings, Evaluator, score_adapter
    from models.rl.rollout import RolloutWorker

    try:
        heldout = load_heldout(environment)
        worker = RolloutWorker(model or None, n_threads=threads)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    settings = EvalSettings(prompts=prompts, max_tokens=max_tokens, temperature=temperature,
                            samples=samples, seed=seed)
    evaluator = Evaluator(worker, heldout, settings)
    try:
        scores = score_adapter(evaluator, Path(adapter) if adapter else None)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        evaluator.close()
    figures: dict[str, Any] = {"environment": environment, "heldout_prompts": heldout.size,
                               **{k: v.as_dict() for k, v in scores.items()}}
    if as_json:
        click.echo(json.dumps(figures, sort_keys=True))
        return
    for name, score in scores.items():
        click.echo(f"{name}: accuracy {score.accuracy:.3f}, 95% interval [{score.low:.3f}, "
                   f"{score.high:.3f}] over {score.prompts} held-out prompts x {score.draws}")


@rl.command("sweep")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              default=None, help="rl.toml every run starts from.")
@click.option("--grid", "grid_items", multiple=True, required=True,
              help="NAME=V1,V2 (repeatable): learning_rate, group_size, jobs_per_step, "
                   "lora_rank, lora_alpha, kl_coef, max_tokens, temperature.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Steps per run.")
@click.option("--eval-prompts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Held-out prompts scored per run (0 = all).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/rl-sweep",
              show_default=True, help="One run directory per combination under it.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON array.")
def sweep_(config_path: str | None, grid_items: tuple[str, ...], steps: int | None,
           eval_prompts: int, out_dir: str, as_json: bool) -> None:
    """Train once per combination of the grid's values; score each on the held-out set."""
    from pathlib import Path

    from node.rl.learner_config import load_config
    from node.rl.sweep import parse_grid, sweep, table

    try:
        config = load_config(config_path, steps=steps)
        grid = parse_grid(list(grid_items))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    try:
        rows = sweep(config, grid, Path(out_dir), eval_prompts)
    except (RuntimeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(rows, sort_keys=True) if as_json else table(rows))
