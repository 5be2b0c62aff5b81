"""Run by test_rl_torchrun.py's torchrun test, one process per rank: rank 0 is the learner's
:class:`Trainer` taking steps over a saved batch, the other ranks :func:`follow` it, as under
``torchrun ... symphony rl train``; rank 0 saves the adapter it ends with and its figures.

Usage: ``torchrun --nproc_per_node N tests/node/rl_ranks_step.py MODEL BATCH OUT_DIR STEPS``
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from models.rl.distributed import Ranks
from models.rl.update import decode_groups
from node.rl.learner_ranks import follow
from node.rl.learner_trainer import Trainer
from tests.node.rl_batch import learner_config
from tests.node.rl_tiny_env import TinyEnv


def main(model: str, batch: str, out_dir: str, steps: int) -> None:
    config = learner_config(model, out_dir)
    ranks = Ranks.from_env()
    assert ranks is not None, "run me under torchrun with 2 or more processes"
    try:
        if not ranks.leader:
            follow(config, ranks)
            return
        _, groups = decode_groups(Path(batch).read_bytes())
        trainer = Trainer(config, TinyEnv(), ranks)
        stats = [asdict(trainer.step(groups, trainer.next_version())) for _ in range(steps)]
        trainer.stop_ranks()
        torch.save({"state": trainer.policy.state()}, Path(out_dir) / "state.pt")
        (Path(out_dir) / "stats.json").write_text(json.dumps(stats))
    finally:
        ranks.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
