"""models.device: the device a node advertises is the one its model runs on. On this CPU-only
machine that is the CPU, named as /proc/cpuinfo names it (not "cpu", not just "x86_64"); a
backend whose weights sit on a GPU is described by that GPU's name and VRAM."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from types import SimpleNamespace

import pytest

from models import device
from models.device import Device, cpu_name, describe_device, parse_nvidia_smi

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""


def test_the_host_cpu_is_described_by_its_model_name() -> None:
    d = describe_device()
    assert d.kind == "cpu" and d.cpu_cores == os.cpu_count()
    assert d.name and d.name.lower() != "cpu" and d.name == cpu_name()
    assert d.memory_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 0
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in
                 Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        if names:
            assert d.name == names[0][:device.MAX_NAME_CHARS]


def test_cpu_name_reads_cpuinfo_and_falls_back_to_the_platform(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    assert cpu_name(info) == "Intel(R) Xeon(R) Platinum 8480+"
    info.write_text("processor\t: 0\nmodel name\t:\nHardware\t: BCM2835\n")  # no usable name
    fallback = platform.processor() or platform.machine()
    assert cpu_name(info) == fallback and cpu_name(tmp_path / "missing") == fallback
    info.write_text(f"model name\t: {'x' * 300}\n")
    assert cpu_name(info) == "x" * device.MAX_NAME_CHARS  # the record's field limit


def test_a_model_on_a_gpu_is_described_by_that_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def h100(index: int) -> tuple[str, int]:
        asked.append(index)
        return "NVIDIA H100 80GB HBM3", 81559 << 20

    monkeypatch.setattr(device, "gpu_description", h100)
    on_gpu = describe_device(SimpleNamespace(gpu=1))
    assert on_gpu == Device("gpu", "NVIDIA H100 80GB HBM3", 81559 << 20, os.cpu_count() or 0)
    assert asked == [1]
    assert describe_device(SimpleNamespace(gpu=None)) == describe_device()  # a CPU backend
    monkeypatch.setattr(device, "gpu_description", lambda index: None)
    assert describe_device(SimpleNamespace(gpu=0)) == Device("gpu", "gpu", 0, os.cpu_count() or 0)


def test_nvidia_smi_answers_are_parsed_strictly() -> None:
    assert parse_nvidia_smi("NVIDIA H100 80GB HBM3, 81559\n") == ("NVIDIA H100 80GB HBM3",
                                                                   81559 << 20)
    assert parse_nvidia_smi("NVIDIA GeForce RTX 4090, 24564\nNVIDIA A10, 1\n") == (
        "NVIDIA GeForce RTX 4090", 24564 << 20)
    for bad in ("", "\n", "NVIDIA H100", ", 81559", "NVIDIA H100, [N/A]", "NVIDIA H100, -1"):
        assert parse_nvidia_smi(bad) is None, bad


def test_loaded_backends_say_they_run_on_the_cpu(tiny_hf: object, tiny_ggufs: dict) -> None:
    assert tiny_hf.gpu is None  # type: ignore[attr-defined]
    assert describe_device(tiny_hf).kind == "cpu"
    pytest.importorskip("llama_cpp")
    from models.loader import load_backend

    llama = load_backend(str(tiny_ggufs["f32"]))
    try:
        assert llama.gpu is None and describe_device(llama) == describe_device()
    finally:
        llama.close()  # type: ignore[attr-defined]
