"""The device a model runs on, as a node advertises it: CPU or GPU, its name, its memory.

:func:`describe_device` answers for a loaded backend (``Backend.gpu``: the CUDA device its
weights are on, None on the CPU) or, without one, for the host CPU:

* on the CPU: kind ``"cpu"``, the CPU's model name (``/proc/cpuinfo``'s ``model name``, else
  ``platform.processor()``, else the machine type such as ``x86_64``) and the host's RAM;
* on a GPU: kind ``"gpu"``, the GPU's name and its memory (VRAM), from torch when it is
  installed with CUDA, else from ``nvidia-smi``; a GPU that neither can name is reported as
  ``"gpu"`` with 0 bytes rather than passed off as the CPU.

:func:`detect_gpu` says whether a CUDA GPU is usable at all, by torch and by llama.cpp
(``llama_supports_gpu_offload``), and when none is, why not (a CPU-only torch build, llama.cpp
built without CUDA, no driver): ``symphony doctor`` prints it.

Everything here is standard library at import time: torch is imported only to name a GPU the
model already runs on, so a node without the models extra still starts and describes its CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
#: how long ``nvidia-smi`` may take to answer before the GPU goes unnamed
NVIDIA_SMI_TIMEOUT_S = 10.0
#: the child process that asks llama.cpp whether it offloads (it loads the library)
LLAMA_PROBE_TIMEOUT_S = 60.0
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


def parse_device(name: str) -> tuple[str, int | None]:
    """A device name as the config and ``--serve-blocks`` take it: ``"auto"``, ``"cpu"``,
    ``"cuda"`` (device 0) or ``"cuda:N"`` -> (kind, CUDA index or None); ValueError else."""
    kind, colon, index = name.partition(":")
    if name in ("auto", "cpu"):
        return name, None
    if kind == "cuda" and not colon:
        return kind, 0
    if kind == "cuda" and index.isdigit():
        return kind, int(index)
    raise ValueError(f"device {name!r}: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")


@dataclass(frozen=True, slots=True)
class GpuReport:
    """Whether a CUDA GPU is usable here, and through what; ``why`` says why not."""

    found: bool
    name: str = ""
    memory_bytes: int = 0
    #: the libraries that can use it: "torch" and/or "llama.cpp"
    via: tuple[str, ...] = ()
    #: one reason per library that cannot, e.g. "torch 2.13.0 is a CPU-only build"
    why: str = ""

    def line(self) -> str:
        if not self.found:
            return f"no GPU: {self.why}"
        memory = f"{self.memory_bytes / 2**30:.1f} GiB" if self.memory_bytes else "memory unknown"
        missing = f" ({self.why})" if self.why else ""
        return f"{self.name}, {memory}, used by {' and '.join(self.via)}{missing}"


def detect_gpu(index: int = 0) -> GpuReport:
    """CUDA device ``index`` as torch and llama.cpp see it (imports both when installed)."""
    reasons: list[str] = []
    via: list[str] = []
    torch_gpu, why = _torch_view(index)
    if torch_gpu is not None:
        via.append("torch")
    else:
        reasons.append(why)
    offload, why = _llama_view()
    if offload:
        via.append("llama.cpp")
    else:
        reasons.append(why)
    named = torch_gpu or (_nvidia_smi_gpu(index) if offload else None)
    if not via or named is None:
        if offload:
            reasons.append("llama.cpp offloads but nvidia-smi names no CUDA device "
                           f"{index}")
        return GpuReport(False, why="; ".join(reasons))
    name, memory = named
    return GpuReport(True, name[:MAX_NAME_CHARS], memory, tuple(via), "; ".join(reasons))


def _torch_view(index: int) -> tuple[tuple[str, int] | None, str]:
    build = torch_build()
    if build is None:
        return None, "torch is not installed"
    version, cuda = build
    if cuda is None:  # known without importing torch (an import of seconds)
        return None, f"torch {version} is a CPU-only build"
    try:
        import torch
    except ImportError as exc:
        return None, f"torch {version} does not import: {exc}"
    cuda = getattr(torch.version, "cuda", None)
    if not cuda:
        return None, f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None, (f"torch {torch.__version__} (CUDA {cuda}) sees no CUDA device {index} "
                      "(driver missing, or CUDA_VISIBLE_DEVICES hides it)")
    return _torch_gpu(index), ""


def torch_build() -> tuple[str, str | None] | None:
    """(torch's version, the CUDA version it was built for or None), read from the installed
    ``torch/version.py`` without importing torch; None when torch is not installed."""
    loaded = sys.modules.get("torch")
    if loaded is not None:  # imported already: ask it
        return str(loaded.__version__), getattr(getattr(loaded, "version", None), "cuda", None)
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return None
    values: dict[str, str | None] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        name = key.split(":")[0].strip()
        if sep and name in ("__version__", "cuda"):
            raw = value.strip()
            values[name] = None if raw == "None" else raw.strip("'\"")
    return str(values.get("__version__") or "unknown"), values.get("cuda")


def _llama_view() -> tuple[bool, str]:
    """Whether llama.cpp offloads to a GPU. Asked in a child process unless llama.cpp is
    loaded here already: loading its CUDA backend into a process whose torch already holds
    CUDA crashed that process on a GPU machine (two CUDA runtimes in one process)."""
    if "llama_cpp" in sys.modules:
        return _llama_offload()
    probe = ("import json, models.device as d; print(json.dumps(d._llama_offload()))")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             timeout=LLAMA_PROBE_TIMEOUT_S, check=True).stdout
        offload, why = json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return False, f"llama.cpp's GPU probe failed: {type(exc).__name__}"
    return bool(offload), str(why)


def _llama_offload() -> tuple[bool, str]:
    try:
        import llama_cpp
    except ImportError:
        return False, "llama-cpp-python is not installed"
    if not llama_cpp.llama_supports_gpu_offload():
        return False, (f"llama.cpp {getattr(llama_cpp, '__version__', '?')} was built without "
                       "GPU offload (make install GPU=cuda rebuilds it with CUDA)")
    return True, ""
