"""The capability record's hardware is the device the node's model runs on: the host CPU by
its model name until the executor has loaded a model, then that model's device (a GPU by its
name and VRAM), described once per loaded backend."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from models import device
from node.ledger.service import LedgerService, detect_hardware
from protocol.codec import decode, encode
from protocol.ledger.records import HardwareSummary


def test_the_record_names_this_cpu() -> None:
    hw = detect_hardware()
    assert hw.device_kind == "cpu" and hw.device_name and hw.device_name.lower() != "cpu"
    assert hw.device_name == device.cpu_name() and hw.cpu_cores == os.cpu_count()
    assert hw.memory_bytes == device.ram_bytes() > 0
    assert decode(encode(hw)) == hw  # within the wire limits


def test_the_record_follows_the_executors_model_onto_its_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def a10(index: int) -> tuple[str, int]:
        asked.append(index)
        return "NVIDIA A10", 23028 << 20

    monkeypatch.setattr(device, "gpu_description", a10)
    service = LedgerService.__new__(LedgerService)  # only the hardware bookkeeping is used
    service.hardware, service._hardware_of = detect_hardware(), None
    cpu = service.hardware
    service._describe_model_device(None)  # no executor service
    service._describe_model_device(SimpleNamespace(solver=None))  # solver not loaded yet
    assert service.hardware == cpu and asked == []
    executor = SimpleNamespace(solver=SimpleNamespace(backend=SimpleNamespace(gpu=0)))
    for _ in range(3):  # polled every capability_poll_ms: described once per backend
        service._describe_model_device(executor)
    assert service.hardware == HardwareSummary(device_kind="gpu", device_name="NVIDIA A10",
                                               memory_bytes=23028 << 20,
                                               cpu_cores=os.cpu_count() or 0)
    assert asked == [0]
