"""The executor's solver settings: a plain node serves the default model, a bad solver spec is
a config error naming it, any importable "module:callable" loads (tests load their double
this way), and the real solver advertises the registry's quantization and gives each
executor its own sampling seed per task."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from node.config import ConfigError, load_config
from node.market.executor import ExecutorSection, load_solver
from protocol.market.messages import Requirement, TaskSpec

from .conftest import ARITH_SOLVER


def spec(question: str = "What is 6 * 7?", task_id: bytes = b"\1" * 32) -> TaskSpec:
    return TaskSpec(task_id=task_id, requester="", question=question, answer_type="number",
                    choices=(), requirement=Requirement(model="", family="", min_context=0),
                    k=1, max_price=1.0, max_tokens=24)


def test_a_plain_config_executes_with_the_default_model(tmp_path: Path) -> None:
    config = load_config({"data_dir": str(tmp_path)}, env={},
                         sections={"executor": ExecutorSection})
    section = config.section("executor")
    assert section.solver == "models" and section.model == ""


@pytest.mark.parametrize("solver", ["", "models", ARITH_SOLVER, "some.module:factory"])
def test_solver_specs_that_are_accepted(solver: str) -> None:
    assert ExecutorSection(solver=solver).solver == solver


@pytest.mark.parametrize("solver", ["model", "some.module", ":factory", "some.module:"])
def test_a_bad_solver_spec_is_a_config_error_naming_it(tmp_path: Path, solver: str) -> None:
    with pytest.raises(ConfigError, match="solver"):
        load_config({"data_dir": str(tmp_path)}, env={"SYMPHONY_EXECUTOR__SOLVER": solver},
                    sections={"executor": ExecutorSection})


@pytest.mark.parametrize("field,value", [("threads", -1)])
def test_out_of_range_model_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ExecutorSection(**{field: value})  # type: ignore[arg-type]


def test_a_test_module_path_loads_as_a_solver(tmp_path: Path) -> None:
    solver = load_solver(ARITH_SOLVER, ExecutorSection(solver=ARITH_SOLVER), tmp_path)
    (model,) = solver.models()
    assert model.name == "test-arith"
    assert solver.solve(spec(), model.name, 24).answer == "42"


@pytest.mark.integration  # loads the real default model
def test_the_model_solver_advertises_quantization_and_seeds_each_executor(
        tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from models.solver import ModelsSolver

    one = load_solver("models", ExecutorSection(threads=1), tmp_path)
    assert isinstance(one, ModelsSolver) and one.temperature is None  # the task's sampling
    assert one.states is not None and one.states.root == tmp_path / "states"
    (model,) = one.models()
    assert (model.name, model.quantization) == ("smollm2-135m-instruct-q4_1", "Q4_1")
    assert model.tokens_per_s > 0 and len(model.model_hash) == 32
    two = ModelsSolver(one.backend)  # another executor of the same model
    task_a, task_b = spec(task_id=b"\1" * 32), spec(task_id=b"\2" * 32)
    assert one.seed_for(task_a, 0) == two.seed_for(task_a, 0)  # anyone can recompute it
    seeds = {one.seed_for(task_a, 0), one.seed_for(task_a, 1), one.seed_for(task_b, 0),
             one.seed_for(dataclasses.replace(task_a, seed=5), 0)}
    assert len(seeds) == 4  # per task, per attempt (executor) and per requester seed base
    sampled = dataclasses.replace(task_a, temperature=0.7, max_tokens=48)
    chains = {one.solve(sampled, model.name, 48, attempt).cot for attempt in range(3)}
    assert len(chains) >= 2  # k executors of one task sample different chains


@pytest.mark.integration  # loads the real default model
def test_the_model_solver_streams_growing_prefixes_of_the_same_result(tmp_path: Path) -> None:
    """``on_text`` sees the text after each token; streaming changes neither the tokens, the
    text nor the commitments verification uses."""
    pytest.importorskip("llama_cpp")
    solver = load_solver("models", ExecutorSection(threads=1), tmp_path / "a")
    solver.fingerprints = True
    (model,) = solver.models()
    task = dataclasses.replace(spec(question="Count from one to twenty in words."),
                               style="chat", answer_type="text", temperature=0.7, max_tokens=20)
    texts: list[str] = []
    streamed = solver.solve(task, model.name, 20, 0, on_text=texts.append)
    plain = solver.solve(task, model.name, 20, 0)
    assert streamed.cot == plain.cot and streamed.output_ids == plain.output_ids
    assert streamed.fingerprints == plain.fingerprints and streamed.fingerprints
    assert streamed.states_root == plain.states_root
    assert len(texts) == streamed.tokens == 20 and texts[-1] == streamed.cot
    assert all(later.startswith(earlier.rstrip("\ufffd"))
               for earlier, later in zip(texts, texts[1:], strict=False))
