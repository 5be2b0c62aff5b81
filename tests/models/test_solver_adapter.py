"""The executor's solver runs an agent's LoRA adapter: a task answered on the adapter differs
from the base model's answer, the base answers as before once the adapter task is done, and an
adapter llama.cpp refuses is a ValueError naming it (models/solver.py, models/llama_backend.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from protocol.market.messages import Requirement, TaskSpec

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")
pytest.importorskip("llama_cpp")


def _task() -> TaskSpec:
    return TaskSpec(task_id=b"\x01" * 32, requester="rq", question="Add 3 and 2.",
                    answer_type="text", choices=(),
                    requirement=Requirement(model="", family="", min_context=0),
                    k=1, max_price=1.0, max_tokens=8)


def test_an_adapter_changes_the_answer_and_leaves_the_base_as_it_was(
        tiny_ggufs: dict[str, Path], tmp_path: Path) -> None:
    from models.llama_backend import LlamaCppBackend
    from models.loader import load_backend
    from models.solver import ModelsSolver
    from tests.models import rl_tiny

    policy = rl_tiny.make_policy(tiny_ggufs["f32"])
    rl_tiny.perturb(policy, scale=0.5)
    adapter = rl_tiny.export_adapter(policy, tmp_path, version=1).path
    backend = load_backend(str(tiny_ggufs["f32"]))
    assert isinstance(backend, LlamaCppBackend)
    solver = ModelsSolver(backend)
    try:
        task = _task()
        base = solver.solve(task, "tiny", 8)
        key = hashlib.sha256(adapter.read_bytes()).hexdigest()  # adapters go by content hash
        solver.add_adapter(key, adapter)
        assert solver.has_adapter(key)
        adapted = solver.solve(task, "tiny", 8, adapter=key)
        assert adapted.adapter == bytes.fromhex(key)  # the result names what it ran on
        assert adapted.output_ids != base.output_ids
        assert solver.solve(task, "tiny", 8).output_ids == base.output_ids
        assert solver.solve(task, "tiny", 8, adapter=key).output_ids == adapted.output_ids

        junk = tmp_path / "junk.gguf"
        junk.write_bytes(b"GGUF" + b"\0" * 64)
        with pytest.raises(ValueError, match="refused the LoRA adapter"):
            solver.add_adapter("junk", junk)
        assert not solver.has_adapter("junk")
        assert solver.solve(task, "tiny", 8).output_ids == base.output_ids
    finally:
        backend.close()
