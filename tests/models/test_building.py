"""models/building.py and models/gguf_torch.py's meta hook: a model build in one thread changes
nothing for a model another thread builds meanwhile.

The daemon's verifier built its fingerprinting model from a GGUF (parameters created on the
meta device through torch's global registration hook) while the ledger service loaded the
card embedder in another thread: the embedder's parameters landed on meta too, its first
forward raised ``Tensor.item() cannot be called on meta tensors`` and the daemon ended.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models import building as building_module  # noqa: E402
from models.building import building  # noqa: E402
from models.gguf_torch import _parameters_on_meta, load_gguf_model  # noqa: E402


def _in_thread(fn):  # type: ignore[no-untyped-def]
    """Run ``fn`` in a new thread to its end; its result (or its exception, raised here)."""
    out: list[object] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def test_meta_parameters_only_for_the_thread_that_builds_on_meta() -> None:
    with _parameters_on_meta():
        ours = torch.nn.Linear(4, 3)
        theirs = _in_thread(lambda: torch.nn.Linear(4, 3))
    assert ours.weight.device.type == "meta"
    assert theirs.weight.device.type == "cpu" and theirs.bias.device.type == "cpu"
    theirs(torch.ones(1, 4))  # real weights: it runs
    assert torch.nn.Linear(4, 3).weight.device.type == "cpu"  # the hook is gone after the block


def test_one_build_at_a_time_across_threads_reentrant_within_one() -> None:
    lock = building_module._BUILD_LOCK
    with building():
        with building():  # a GGUF backend load builds its model inside its own build
            assert lock._is_owned()  # type: ignore[attr-defined]
        assert not _in_thread(lambda: lock.acquire(blocking=False))
    assert _in_thread(lambda: lock.acquire(blocking=False) and (lock.release() or True))


def test_a_gguf_model_is_built_under_the_build_lock(tiny_ggufs: dict[str, Path]) -> None:
    lock = building_module._BUILD_LOCK
    held: list[bool] = []

    def note(module: torch.nn.Module, name: str, param: object) -> None:
        if threading.get_ident() == main:
            held.append(lock._is_owned())  # type: ignore[attr-defined]

    main = threading.get_ident()
    handle = torch.nn.modules.module.register_module_parameter_registration_hook(note)
    try:
        load_gguf_model(tiny_ggufs["f32"])
    finally:
        handle.remove()
    assert held and all(held)
    assert not lock._is_owned()  # type: ignore[attr-defined]
