"""`symphony rl sweep`: train once per combination of hyperparameters and score each result.

Every run starts from the same config (rl.toml and flags) with one combination of the grid's
values (``--grid learning_rate=1e-4,1e-3 --grid group_size=4,8``), trains ``steps`` steps in
its own directory under ``out`` (node/rl/learner.py), and its last adapter is scored on the
held-out prompts (models/rl/heldout.py) beside the base model, same prompts, same seeds. The
rows say which setting learns: the held-out accuracy against the base's, with its 95%
interval, and the mean reward of the first and last steps.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from node.rl.learner_config import LearnerConfig

#: the hyperparameters a sweep may vary
SWEPT = ("learning_rate", "group_size", "jobs_per_step", "lora_rank", "lora_alpha", "kl_coef",
         "max_tokens", "temperature")
#: steps whose mean reward is "first" and "last" in a row
EDGE_STEPS = 5


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["learning_rate=1e-4,1e-3", ...]`` -> ``{"learning_rate": [1e-4, 1e-3]}``, each value
    of the config field's type; ``ValueError`` names a bad item."""
    types = {f.name: type(getattr(LearnerConfig(), f.name)) for f in fields(LearnerConfig)}
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or key not in SWEPT:
            raise ValueError(f"--grid {item!r}: expected NAME=V1,V2 with NAME one of {', '.join(SWEPT)}")
        try:
            grid[key] = [types[key](v) for v in values.split(",") if v]
        except ValueError:
            raise ValueError(f"--grid {item!r}: values must be {types[key].__name__}s") from None
        if not grid[key]:
            raise ValueError(f"--grid {item!r}: no values")
    return grid


def combinations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = sorted(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def sweep(config: LearnerConfig, grid: dict[str, list[Any]], out: Path, eval_prompts: int,
          train: Callable[[LearnerConfig], Any] | None = None,
          score: Callable[[LearnerConfig, list[str], int], list[Any]] | None = None,
          ) -> list[dict[str, Any]]:
    """One row per combination (and the base model's score in each row's ``base``)."""
    from node.bench.rl.bench import score_heldout
    from node.rl.learner import run_training

    train = train or run_training
    score = score or score_heldout
    runs = []
    for i, combo in enumerate(combinations(grid)):
        run_config = replace(config, out_dir=str(out / f"run-{i}"), **combo)
        runs.append((combo, train(run_config)))
    scores = score(config, [r.last_adapter for _, r in runs], eval_prompts)
    base, rows = scores[0], []
    for (combo, report), s in zip(runs, scores[1:], strict=True):
        rewards = [st.mean_reward for st in report.steps]
        edge = min(EDGE_STEPS, len(rewards))
        rows.append({**combo, "steps": len(rewards), "wall_s": round(report.wall_s, 1),
                     "reward_first": round(sum(rewards[:edge]) / max(edge, 1), 4),
                     "reward_last": round(sum(rewards[-edge:]) / max(edge, 1), 4),
                     "heldout": s.as_dict(), "base": base.as_dict()})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table (what the README keeps)."""
    if not rows:
        return ""
    swept = [k for k in rows[0] if k in SWEPT]
    head = [*swept, "steps", "reward first", "reward last", "held-out (95%)", "base (95%)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        h, b = r["heldout"], r["base"]
        cells = [*(str(r[k]) for k in swept), str(r["steps"]), f"{r['reward_first']:.3f}",
                 f"{r['reward_last']:.3f}", f"{h['accuracy']:.3f} ± {h['half_width']:.3f}",
                 f"{b['accuracy']:.3f} ± {b['half_width']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
