"""How much attention-cache memory a block server reserves for all its sessions by default.

``[inference] max_cache_mb = 0`` (the default) sizes it from the free memory of the device
the served blocks' caches live on, measured once the stage is loaded (its weights are no
longer free): the GPU's when the stage's layers are on a CUDA device and a GPU is detected
(models.device.detect_gpu), else the host's available RAM. Sessions may reserve
:data:`CACHE_FRACTION` of it, never less than :data:`MIN_CACHE_BYTES`; the rest is left to
activations, the executor's model and everything else on the machine. A session's cache is
reserved when it opens (protocol.inference.session), so the budget is a promise the server
can keep rather than a guess: past it, a session is refused with a reason.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from models.device import NVIDIA_SMI_TIMEOUT_S, GpuReport, detect_gpu, parse_nvidia_smi

#: the share of the device's free memory that sessions' caches may reserve
CACHE_FRACTION = 0.5
#: the least a server reserves for caches, however little is free (a few short sessions)
MIN_CACHE_BYTES = 64 << 20
#: what is assumed free when nothing can tell (no /proc/meminfo, a GPU nobody can measure)
UNKNOWN_FREE_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class CacheBudget:
    bytes: int  # attention-cache bytes all sessions together may reserve
    device: str  # "gpu" or "cpu": where the caches live
    free_bytes: int  # that device's free memory when it was measured


def ram_free_bytes(unknown: int = UNKNOWN_FREE_BYTES) -> int:
    """The host's available memory (``MemAvailable``), or ``unknown`` when nothing tells."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return unknown


def gpu_free_bytes(index: int) -> int | None:
    """Free memory of CUDA device ``index``: torch's view, else nvidia-smi's; None if neither."""
    try:
        import torch

        if torch.cuda.is_available() and index < torch.cuda.device_count():
            return int(torch.cuda.mem_get_info(index)[0])
    except (ImportError, RuntimeError):
        pass
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--id={index}", "--query-gpu=name,memory.free",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    parsed = parse_nvidia_smi(out)
    return parsed[1] if parsed else None


def cuda_index(stage_device: str) -> int | None:
    """``"cuda:1"`` -> 1, ``"cuda"`` -> 0; None for any other device (the CPU)."""
    kind, _, index = stage_device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index.isdigit() else 0


def cache_budget(stage_device: str, *, detect: Callable[[int], GpuReport] = detect_gpu,
                 gpu_free: Callable[[int], int | None] = gpu_free_bytes,
                 ram_free: Callable[[], int] = ram_free_bytes,
                 fraction: float = CACHE_FRACTION) -> CacheBudget:
    """The default cache budget of a stage whose layers are on ``stage_device`` (torch's
    name: "cpu", "cuda", "cuda:1")."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    index = cuda_index(stage_device)
    free, device = None, "cpu"
    if index is not None and detect(index).found:
        free, device = gpu_free(index), "gpu"
        if free is None:
            free = UNKNOWN_FREE_BYTES
    if free is None:
        free = ram_free()
    budget = max(MIN_CACHE_BYTES, int(free * fraction))
    return CacheBudget(bytes=budget, device=device, free_bytes=free)
