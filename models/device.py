"""The device a model runs on, as a node advertises it: CPU or GPU, its name, its memory.

:func:`describe_device` answers for a loaded backend (``Backend.gpu``: the CUDA device its
weights are on, None on the CPU) or, without one, for the host CPU:

* on the CPU: kind ``"cpu"``, the CPU's model name (``/proc/cpuinfo``'s ``model name``, else
  ``platform.processor()``, else the machine type such as ``x86_64``) and the host's RAM;
* on a GPU: kind ``"gpu"``, the GPU's name and its memory (VRAM), from torch when it is
  installed with CUDA, else from ``nvidia-smi``; a GPU that neither can name is reported as
  ``"gpu"`` with 0 bytes rather than passed off as the CPU.

Everything here is standard library at import time: torch is imported only to name a GPU the
model already runs on, so a node without the models extra still starts and describes its CPU.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
#: how long ``nvidia-smi`` may take to answer before the GPU goes unnamed
NVIDIA_SMI_TIMEOUT_S = 10.0
#: the field limits of the capability record (protocol.ledger.records.HardwareSummary)
MAX_NAME_CHARS = 128
UNNAMED_GPU = "gpu"


@dataclass(frozen=True, slots=True)
class Device:
    kind: str  # "cpu" or "gpu"
    name: str  # e.g. "AMD EPYC 7763 64-Core Processor", "NVIDIA H100 80GB HBM3"
    memory_bytes: int  # the host's RAM on the CPU, the GPU's VRAM on a GPU
    cpu_cores: int  # logical CPUs of the host


def describe_device(backend: object | None = None) -> Device:
    """The device ``backend``'s model runs on (None: the host CPU)."""
    cores = os.cpu_count() or 0
    gpu = getattr(backend, "gpu", None) if backend is not None else None
    if gpu is None:
        return Device("cpu", cpu_name(), ram_bytes(), cores)
    name, memory = gpu_description(int(gpu)) or (UNNAMED_GPU, 0)
    return Device("gpu", name[:MAX_NAME_CHARS], memory, cores)


def cpu_name(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name: ``/proc/cpuinfo``, else the platform's description."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name" and value.strip():
            return value.strip()[:MAX_NAME_CHARS]
    return (platform.processor() or platform.machine() or "unknown cpu")[:MAX_NAME_CHARS]


def ram_bytes() -> int:
    """The host's physical memory in bytes (0 where the platform does not say)."""
    try:
        return max(0, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def gpu_description(index: int) -> tuple[str, int] | None:
    """(name, memory in bytes) of CUDA device ``index``, or None if nothing can tell."""
    return _torch_gpu(index) or _nvidia_smi_gpu(index)


def _torch_gpu(index: int) -> tuple[str, int] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(index)
    return str(props.name), int(props.total_memory)


def _nvidia_smi_gpu(index: int) -> tuple[str, int] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, f"--id={index}", "--query-gpu=name,memory.total",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out)


def parse_nvidia_smi(out: str) -> tuple[str, int] | None:
    """``"NVIDIA H100 80GB HBM3, 81559"`` (name, MiB) -> (name, bytes); None if malformed."""
    name, sep, mib = out.strip().splitlines()[0].rpartition(",") if out.strip() else ("", "", "")
    if not sep or not name.strip() or not mib.strip().isdigit():
        return None
    return name.strip(), int(mib.strip()) << 20
