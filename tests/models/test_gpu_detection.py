"""GPU detection (models.device.detect_gpu): found through torch or llama.cpp, or why not."""

from __future__ import annotations

import sys
import types
from importlib.metadata import PackageNotFoundError, version

import pytest

from models import device
from models.config import ModelConfig
from models.device import detect_gpu


def _torch(cuda: str | None, count: int) -> types.ModuleType:
    """A stand-in torch module: version, CUDA build and visible devices as given."""
    torch = types.ModuleType("torch")
    torch.__version__ = "9.9.9"  # type: ignore[attr-defined]
    torch.version = types.SimpleNamespace(cuda=cuda)  # type: ignore[attr-defined]
    props = types.SimpleNamespace(name="NVIDIA Test GPU", total_memory=24 << 30)
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: count > 0, device_count=lambda: count,
        get_device_properties=lambda index: props)
    return torch


def _llama(offload: bool) -> types.ModuleType:
    llama = types.ModuleType("llama_cpp")
    llama.__version__ = "0.0.1"  # type: ignore[attr-defined]
    llama.llama_supports_gpu_offload = lambda: offload  # type: ignore[attr-defined]
    return llama


def test_torch_build_is_read_without_importing_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "torch", _torch("12.4", 1))
        assert device.torch_build() == ("9.9.9", "12.4")  # imported: asked directly
    with monkeypatch.context() as patch:
        patch.delitem(sys.modules, "torch", raising=False)
        build = device.torch_build()  # read from the installed torch/version.py
        assert "torch" not in sys.modules
    try:
        installed = version("torch")
    except PackageNotFoundError:
        assert build is None
        return
    assert build is not None and build[0] == installed


def test_this_machine_says_why_it_has_no_gpu() -> None:
    report = detect_gpu()
    if report.found:
        pytest.skip(f"this machine has a GPU: {report.line()}")
    line = report.line()
    assert line.startswith("no GPU: ")
    # one reason per library, each naming it
    assert "torch" in line and "llama" in line


@pytest.mark.parametrize(("cuda", "count", "offload", "found", "words"), [
    (None, 0, False, False, ["torch 9.9.9 is a CPU-only build",
                             "llama.cpp 0.0.1 was built without GPU offload"]),
    ("12.4", 0, False, False, ["CUDA 12.4", "sees no CUDA device 0"]),
    ("12.4", 1, False, True, ["NVIDIA Test GPU", "24.0 GiB", "used by torch"]),
    ("12.4", 1, True, True, ["used by torch and llama.cpp"]),
])
def test_torch_and_llama_cpp_each_say_whether_they_can_use_a_gpu(
        monkeypatch: pytest.MonkeyPatch, cuda: str | None, count: int, offload: bool,
        found: bool, words: list[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", _torch(cuda, count))
    monkeypatch.setitem(sys.modules, "llama_cpp", _llama(offload))
    report = detect_gpu()
    assert report.found is found
    for word in words:
        assert word in report.line()


def test_llama_cpp_alone_is_named_by_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _torch(None, 0))
    monkeypatch.setitem(sys.modules, "llama_cpp", _llama(True))
    monkeypatch.setattr(device, "_nvidia_smi_gpu", lambda index: None)
    report = detect_gpu()
    assert not report.found and "nvidia-smi names no CUDA device 0" in report.why
    monkeypatch.setattr(device, "_nvidia_smi_gpu", lambda index: ("NVIDIA L4", 23034 << 20))
    report = detect_gpu()
    assert report.found and report.via == ("llama.cpp",) and report.name == "NVIDIA L4"


def test_gpu_layers_default_to_all_and_refuse_nonsense() -> None:
    assert ModelConfig().n_gpu_layers == -1
    assert ModelConfig(n_gpu_layers=0).n_gpu_layers == 0
    with pytest.raises(ValueError, match="n_gpu_layers"):
        ModelConfig(n_gpu_layers=-2)
