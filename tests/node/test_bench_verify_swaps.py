"""Precision swaps on the real shipped model (SmolLM2-135M Q4_1): the coarser GGUFs
models.requantize makes, the layer-state check catching each of them served in place of the
declared model, the bf16 rounding it does not catch (its errors sit inside llama.cpp's honest
ones), and honest runs of node.bench.verify.honest passing."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

from models.commitments import commitments_for  # noqa: E402
from models.gguf_reader import read_gguf  # noqa: E402
from models.layer_states import MEAN_LAYER_ERR, layer_states  # noqa: E402
from models.registry import default_model  # noqa: E402
from models.requantize import requantize  # noqa: E402
from node.bench.verify import honest, swaps  # noqa: E402
from node.bench.verify.verdict import check_result  # noqa: E402
from protocol.market.messages import Requirement, TaskSpec  # noqa: E402

QUESTION = "A shop sells pens at 3 dollars each. How much do 7 pens cost?"
GGML_Q4_0, GGML_Q3_K, GGML_Q2_K, GGML_BF16 = 2, 11, 10, 30


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("requantized")


@pytest.mark.parametrize(("kind", "down", "narrow"), [
    ("Q4_0", GGML_Q4_0, GGML_Q4_0),
    # k-quants need rows of 256 values: the 1536-wide ffn_down gets them, the 576-wide
    # projections fall back to Q4_0 (and no tensor gets a type of llama.cpp's mixes)
    ("Q3_K", GGML_Q3_K, GGML_Q4_0),
    ("Q2_K", GGML_Q2_K, GGML_Q4_0),
    ("BF16", GGML_BF16, GGML_BF16),
])
def test_requantize_writes_the_type_asked_for_once(folder: Path, kind: str, down: int,
                                                   narrow: int) -> None:
    path = requantize(default_model().path, folder, kind)
    _, tensors = read_gguf(path)
    assert tensors["blk.3.ffn_down.weight"].ggml_type == down
    assert tensors["blk.3.attn_q.weight"].ggml_type == narrow
    stamp = path.stat().st_mtime_ns
    assert requantize(default_model().path, folder, kind) == path  # reused, not rewritten
    assert path.stat().st_mtime_ns == stamp
    assert not list(folder.glob("*.part"))


def test_requantize_refuses_an_unknown_type(folder: Path) -> None:
    with pytest.raises(ValueError, match="unknown quantization 'Q1_X'"):
        requantize(default_model().path, folder, "Q1_X")


@pytest.fixture(scope="module")
def runner() -> Any:
    from models.checks import CheckRunner
    from models.config import ModelConfig
    from models.loader import load_backend

    serve = load_backend(ModelConfig())
    serve.enable_state_capture()
    return CheckRunner(serve)


@pytest.fixture(scope="module")
def question() -> tuple[TaskSpec, Any]:
    from models.cot import problem_of

    task = TaskSpec(task_id=b"\x07" * 32, requester="rq", question=QUESTION,
                    answer_type="number", choices=(),
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=0.0, max_tokens=64)
    return task, problem_of(task)


def _checks(runner: Any, store: Any, backend: Any, question: tuple[TaskSpec, Any]) -> list[bool]:
    """The result ``backend`` gives, committed and checked on three draws of layers."""
    task, problem = question
    s = swaps.solve_with(backend, task, problem, 64)
    made = commitments_for(backend, s.prompt_ids, s.output_ids, store, task.task_id)
    chunks = tuple(range(min(2, len(made.fingerprints))))
    return [check_result(runner, store, chunks, layers, None, task, made, s.output_ids, s.cot,
                         s.answer) for layers in ((2, 9, 17), (5, 21, 30), (12, 26, 28))]


@pytest.mark.integration
def test_every_coarser_quantization_fails_the_check_the_declared_one_passes(
        runner: Any, question: tuple[TaskSpec, Any], folder: Path, tmp_path: Path) -> None:
    from models.state_store import StateStore

    store = StateStore(tmp_path / "states", keep_ms=0)
    info = runner.backend.info
    assert _checks(runner, store, runner.backend, question) == [True] * 3
    for kind in swaps.SWAPS:
        cheat = swaps.capturing(info, requantize(info.path, folder, kind), 1)
        assert _checks(runner, store, cheat, question) == [False] * 3, kind


@pytest.mark.integration
def test_bf16_rounded_weights_sit_inside_the_honest_llama_cpp_errors(
        runner: Any, question: tuple[TaskSpec, Any]) -> None:
    from models.fingerprint import fingerprint_backend

    task, problem = question
    verifier = fingerprint_backend(runner.backend)
    s = swaps.solve_with(runner.backend, task, problem, 48)
    ids, first = s.prompt_ids + s.output_ids, len(s.prompt_ids)
    llama = swaps.layer_errors(verifier, ids, runner.backend.captured_states(ids)[0], first)
    fp32 = swaps.layer_errors(verifier, ids, layer_states(verifier, ids)[0], first)
    rounded = swaps.layer_errors(verifier, ids,
                                 layer_states(swaps.bf16_rounded(verifier), ids)[0], first)
    assert float(fp32[1].max()) < 1e-5  # the fp32 prefill: float reordering at most
    assert 1e-4 < float(rounded[1].min())  # the rounding shows against fp32 ...
    assert float(rounded[1].max()) < float(np.median(llama[1]))  # ... not against llama.cpp
    assert float(llama[1].max()) < MEAN_LAYER_ERR  # which the check accepts
    tally = swaps.ErrorTally()
    for name, errors in (("llama", llama), ("fp32", fp32), ("bf16", rounded)):
        tally.add(name, errors)
    figures = swaps.separation(tally, ("llama", "fp32"), ("bf16",))
    assert figures["separated"] is False and figures["gap"] < 1
    assert figures["separated_from"] == {"llama": False, "fp32": True}


@pytest.fixture(scope="module")
def executors(runner: Any) -> dict[str, tuple[Any, int]]:
    return honest.executors(runner)


@pytest.mark.integration
def test_honest_runs_over_every_executor_pass(runner: Any, question: tuple[TaskSpec, Any],
                                              executors: dict[str, tuple[Any, int]],
                                              tmp_path: Path) -> None:
    assert set(executors) == {"llama_cpp_t1", "llama_cpp_t2", "torch_t1", "torch_t2"}
    for name, backend in executors.items():  # one short run on each, checked
        got = honest.run_honest(runner, tmp_path / name, [question], 1, random.Random(3),
                                backends={name: backend}, tokens=16)
        assert got["honest_runs"] == 1 and got["false_positives"] == 0, (name, got)
        assert got["false_positives_by_executor"] == {name: 0}
        assert got["fp_upper_95"] == pytest.approx(0.95, rel=1e-3)  # 1 - 0.05 ** (1 / 1)
    with pytest.raises(ValueError):
        honest.run_honest(runner, tmp_path, [question], 0, random.Random(3))
