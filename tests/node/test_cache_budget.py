"""node/inference/cache_budget.py: a block server's default attention-cache budget is half the
free memory of the device its caches live on: the GPU's when its layers are on a detected CUDA
device (a detected-GPU double here), else the host's RAM."""

from __future__ import annotations

from typing import Any

import pytest

from models.device import GpuReport
from node.inference.cache_budget import MIN_CACHE_BYTES, cache_budget, cuda_index


def _gpu(found: bool) -> Any:
    return lambda index: GpuReport(found, "GPU double", 80 << 30, ("torch",) if found else (),
                                   "" if found else "no driver")


def test_the_cache_budget_comes_from_the_free_memory_of_the_caches_device() -> None:
    gpu_free = {0: 40 << 30, 1: 10 << 30}
    kw: dict[str, Any] = {"gpu_free": gpu_free.get, "ram_free": lambda: 8 << 30}
    on_gpu = cache_budget("cuda:1", detect=_gpu(True), **kw)
    assert (on_gpu.device, on_gpu.free_bytes, on_gpu.bytes) == ("gpu", 10 << 30, 5 << 30)
    assert cache_budget("cuda", detect=_gpu(True), **kw).bytes == 20 << 30
    # layers on the CPU (a GPU detected or not), or a CUDA device no one can use: RAM
    for device, detect in (("cpu", _gpu(True)), ("cuda:0", _gpu(False))):
        budget = cache_budget(device, detect=detect, **kw)
        assert (budget.device, budget.bytes) == ("cpu", 4 << 30)
    assert cache_budget("cpu", detect=_gpu(True), gpu_free=gpu_free.get,
                        ram_free=lambda: 1 << 20).bytes == MIN_CACHE_BYTES
    assert [cuda_index(d) for d in ("cpu", "cuda", "cuda:3", "mps")] == [None, 0, 3, None]
    with pytest.raises(ValueError, match="fraction"):
        cache_budget("cpu", fraction=0.0, **kw)
