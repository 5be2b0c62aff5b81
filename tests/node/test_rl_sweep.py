"""`symphony rl sweep`: the grid it parses, one run per combination, each scored beside the
base model (in-test stand-ins for training and scoring: the real ones are the sweep itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from models.rl.heldout import HeldoutScore
from node.rl.learner import TrainReport
from node.rl.learner_config import LearnerConfig
from node.rl.learner_trainer import StepStats
from node.rl.sweep import combinations, parse_grid, sweep, table


def test_the_grid_parses_to_typed_values_and_refuses_the_rest() -> None:
    grid = parse_grid(["learning_rate=1e-4,1e-3", "group_size=4,8"])
    assert grid == {"learning_rate": [1e-4, 1e-3], "group_size": [4, 8]}
    assert len(combinations(grid)) == 4
    for bad in ("learning_rate", "seed=1,2", "group_size=4.5", "kl_coef="):
        with pytest.raises(ValueError, match="--grid"):
            parse_grid([bad])


def test_each_combination_trains_in_its_own_directory_and_is_scored(tmp_path: Path) -> None:
    trained: list[LearnerConfig] = []

    def train(config: LearnerConfig) -> TrainReport:
        trained.append(config)
        steps = [StepStats(version=v, mean_reward=config.learning_rate * v, groups=1, skipped=0,
                           tokens=1, masked=0, loss=0.0, kl=0.0, step_s=0.0) for v in range(1, 11)]
        return TrainReport(steps=steps, wall_s=3.0, last_adapter=f"{config.out_dir}/a.gguf")

    def score(config: LearnerConfig, adapters: list[str], prompts: int) -> list[Any]:
        assert prompts == 7
        return [HeldoutScore(accuracy=0.1 * i, low=0.0, high=0.2 * i + 0.1, prompts=7, draws=1)
                for i in range(len(adapters) + 1)]

    rows = sweep(LearnerConfig(steps=10), {"learning_rate": [1.0, 2.0]}, tmp_path, 7, train, score)
    assert [c.out_dir for c in trained] == [str(tmp_path / "run-0"), str(tmp_path / "run-1")]
    assert [c.learning_rate for c in trained] == [1.0, 2.0]
    assert rows[1]["reward_first"] == pytest.approx(6.0)  # mean of 2 x (1..5)
    assert rows[1]["reward_last"] == pytest.approx(16.0)  # mean of 2 x (6..10)
    assert rows[1]["heldout"]["accuracy"] == 0.2 and rows[1]["base"]["accuracy"] == 0.0
    text = table(rows).splitlines()
    assert text[0].startswith("| learning_rate | steps |") and len(text) == 4
