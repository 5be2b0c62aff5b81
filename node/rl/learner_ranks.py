"""The ranks of a learner started by ``torchrun`` other than rank 0.

Rank 0 runs the whole learner (node/rl/learner.py: the job book, the workers, validation,
publishing). At each step it broadcasts the step's batch (models/rl/update.py's
:func:`encode_groups`); every rank then computes its share of the gradient under DDP and takes
the same optimizer step (models/rl/update.py), so all hold the same weights. The other ranks
do nothing else: :func:`follow` loads the policy and the run directory's last checkpoint, as
rank 0 does, and answers batches until rank 0 broadcasts an empty one at the end of its run.

The command for a multi-GPU learner (one process per GPU, NCCL)::

    torchrun --standalone --nproc_per_node 4 "$(command -v symphony)" rl train --config rl.toml
"""

from __future__ import annotations

from models.rl.distributed import Ranks
from models.rl.update import accumulate, decode_groups
from node.rl.learner_config import LearnerConfig
from node.rl.learner_trainer import load_policy, update_config


def follow(config: LearnerConfig, ranks: Ranks) -> int:
    """Take rank 0's steps until it stops; the number of steps taken."""
    policy, optimizer, _ = load_policy(config, ranks)
    steps = 0
    while data := ranks.broadcast_bytes(None):
        _, groups = decode_groups(data)
        if accumulate(policy, groups, update_config(config), ranks).useful:
            optimizer.step()
        steps += 1
    return steps
