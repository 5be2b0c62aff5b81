"""What the inference service measures of its stage: its speed per block and the device its
layers live on (the host's free memory comes from node/inference/cache_budget.py)."""

from __future__ import annotations

import time
from typing import Any


def measure_ms_per_block(stage: Any, repeats: int = 5) -> float:
    """Milliseconds per block per token: one new position through the stage, warm cache."""
    import numpy as np

    from models.blocks import StageCache

    cache = StageCache()
    x = np.zeros((1, stage.hidden_size), np.float32)
    stage.forward(np.zeros((8, stage.hidden_size), np.float32), 0, cache)  # warm-up
    started = time.perf_counter()
    for i in range(repeats):
        stage.forward(x, 8 + i, cache)
    per_token = (time.perf_counter() - started) * 1000 / repeats
    return per_token / max(1, stage.end - stage.start)


def device_of(stage: Any) -> str:
    """Where a stage's layers are: torch's device name ("cpu", "cuda:0")."""
    for layer in stage.layers:
        for param in layer.parameters():
            return str(param.device)
    return "cpu"
