"""The verifier's model check on a real (tiny, random-weight) llama: an executor's honest
solution passes; another model, another quantization, altered tokens, a fabricated CoT and a
changed answer fail. The executor serves with llama.cpp and fingerprints on transformers, as
the daemon does; the verifier loads its own backend on the same GGUF."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch", reason="needs torch and gguf (pip install -e .[models])")
pytest.importorskip("gguf", reason="needs torch and gguf (pip install -e .[models])")

from models.checks import CheckRunner  # noqa: E402
from models.commitments import CHUNK_TOKENS, fingerprints_for  # noqa: E402
from protocol.market.messages import TaskSpec, Turn  # noqa: E402
from protocol.verification.rules import choose_chunks  # noqa: E402
from protocol.verification.verifier import StartCheck  # noqa: E402
from tests.models import tiny  # noqa: E402
from tests.models.checks_bench import TASK, backend, fetched_from, layer_check  # noqa: E402


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny-verify")
    base = tiny.tiny_model(seed=0)
    return {"f32": tiny.write_gguf(base, d / "tiny-f32.gguf"),
            "q8": tiny.write_gguf(base, d / "tiny-q8.gguf", quant="Q8_0"),
            "q4": tiny.write_gguf(base, d / "tiny-q4.gguf", quant="Q4_0"),
            "other": tiny.write_gguf(tiny.tiny_model(seed=1), d / "tiny-other.gguf")}


@pytest.fixture(scope="module")
def verifier(ggufs: dict[str, Path]) -> CheckRunner:
    return CheckRunner(backend(ggufs["f32"], "transformers"))


def executor_check(exec_backend: Any, claimed_hash: bytes, seed: int = 0,
                   n_chunks: int = 2) -> StartCheck:
    from models.cot import Problem, solve

    sol = solve(exec_backend, Problem(TASK.question), max_tokens=80, seed=seed,
                temperature=0.8)
    ids = list(sol.token_ids)
    assert len(ids) > CHUNK_TOKENS, "the tiny model should talk long enough for two chunks"
    prints = fingerprints_for(exec_backend, sol.prompt_token_ids, ids)
    chunks = choose_chunks(bytes([seed]) * 32, "e", len(prints), n_chunks)
    return StartCheck(check_id=b"\x02" * 32, task=TASK, model_hash=claimed_hash,
                      output_ids=tuple(ids), answer=sol.answer, cot=sol.cot_text,
                      chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
                      fingerprints=tuple(prints[i] for i in chunks), deadline_at_ms=0)


@pytest.mark.parametrize("kind", ["llama.cpp", "transformers"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_honest_solution_passes(ggufs: dict[str, Path], verifier: CheckRunner, kind: str,
                                seed: int) -> None:
    check = executor_check(backend(ggufs["f32"], kind), verifier.model_hash, seed)
    done = verifier.run(check)
    assert done.passed, done.detail
    assert verifier.last is not None and verifier.last.prefill_ms > 0


def check_of(served: Any, sol: Any, task: TaskSpec, verifier: CheckRunner,
             **extra: Any) -> StartCheck:
    """The verifier's check of ``sol`` (served by ``served``): two fixed chunks' fingerprints."""
    ids = list(sol.token_ids)
    prints = fingerprints_for(served, sol.prompt_token_ids, ids)
    chunks = choose_chunks(b"\7" * 32, "e", len(prints), 2)
    return StartCheck(check_id=b"\2" * 32, task=task, model_hash=verifier.model_hash,
                      output_ids=tuple(ids), answer=sol.answer, cot=sol.cot_text,
                      chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
                      fingerprints=tuple(prints[i] for i in chunks), deadline_at_ms=0,
                      **extra)


def test_a_sampled_chat_answer_verified_honestly_passes(ggufs: dict[str, Path],
                                                        verifier: CheckRunner) -> None:
    """A chat task with earlier turns, sampled at the requester's temperature with the seed
    of the executor's attempt: the verifier rebuilds the same prompt and the check passes;
    a verifier shown another conversation rebuilds another prompt, and it fails."""
    from models.cot import problem_of, solve
    from protocol.market.sampling import executor_seed

    task = dataclasses.replace(TASK, style="chat", temperature=0.7, seed=9, history=(
        Turn(role="system", content="Be brief."), Turn(role="user", content="I am Ada."),
        Turn(role="assistant", content="Hello Ada.")))
    served = backend(ggufs["f32"], "llama.cpp")
    sol = solve(served, problem_of(task), max_tokens=80, temperature=task.temperature,
                seed=executor_seed(task.task_id, task.seed, 2))
    check = check_of(served, sol, task, verifier)
    done = verifier.run(check)
    assert done.passed, done.detail
    other = dataclasses.replace(check, task=dataclasses.replace(task, history=task.history[:1]))
    assert not verifier.run(other).passed


def test_an_agents_answer_with_tool_calls_verified_honestly_passes(
        ggufs: dict[str, Path], verifier: CheckRunner) -> None:
    """An agent's answer: its system prompt and tool calls are part of the prompt; the
    verifier given them (from the signed result) rebuilds it and the check passes, and the
    answer is the calculator's output the tiny model never states; shown another tool output
    or another system prompt it rebuilds another prompt, and it fails."""
    from models.cot import problem_of, solve
    from protocol.agents.wire import ToolCallRecord

    task = dataclasses.replace(TASK, answer_type="number")
    calls = (ToolCallRecord(name="calculator", arguments='{"expression":"6*7"}', output="42"),)
    served = backend(ggufs["f32"], "llama.cpp")
    sol = solve(served, problem_of(task, "You compute.", calls), max_tokens=80, seed=3)
    assert sol.answer == "42"
    check = check_of(served, sol, task, verifier, system_prompt="You compute.",
                     tool_calls=calls)
    done = verifier.run(check)
    assert done.passed, done.detail
    other_call = (dataclasses.replace(calls[0], output="43"),)
    assert not verifier.run(dataclasses.replace(check, tool_calls=other_call)).passed
    assert not verifier.run(dataclasses.replace(check, system_prompt="")).passed


def test_a_planners_plan_under_the_grammar_verified_honestly_passes(
        ggufs: dict[str, Path], verifier: CheckRunner) -> None:
    """A planner's result (style ``plan``): generated under the plan grammar, its text keeps
    the grammar's shape even on a random-weight model; the verifier rebuilds the planner's
    prompt and re-runs the claimed tokens (no grammar needed to check), and it passes; the
    same tokens claimed for a ``chat`` task (another prompt) fail."""
    from models.cot import problem_of, solve

    task = dataclasses.replace(TASK, style="plan", temperature=0.7, seed=5)
    served = backend(ggufs["f32"], "llama.cpp")
    sol = solve(served, problem_of(task), max_tokens=60, temperature=0.7, seed=5)
    assert re.match(r'\{\s*"steps"\s*:\s*\[\s*\{\s*"instruction"', sol.cot_text), sol.cot_text
    assert sol.answer == sol.cot_text.strip()
    check = check_of(served, sol, task, verifier)
    done = verifier.run(check)
    assert done.passed, done.detail
    assert not verifier.run(dataclasses.replace(
        check, task=dataclasses.replace(task, style="chat"))).passed


@pytest.mark.parametrize("which", ["other", "q8"])
def test_other_model_or_quantization_fails(ggufs: dict[str, Path], verifier: CheckRunner,
                                           which: str) -> None:
    check = executor_check(backend(ggufs[which], "transformers"), verifier.model_hash)
    done = verifier.run(check)
    assert not done.passed and "chunk" in done.detail


def test_altered_tokens_fabricated_cot_or_answer_fail(ggufs: dict[str, Path],
                                                      verifier: CheckRunner) -> None:
    honest = executor_check(backend(ggufs["f32"], "transformers"), verifier.model_hash)
    ids = list(honest.output_ids)
    first = honest.chunk_indices[0] * CHUNK_TOKENS
    ids[first] = (ids[first] + 1) % 200
    exec_b = verifier.backend
    tampered = dataclasses.replace(honest, output_ids=tuple(ids),
                                   cot=exec_b.detokenize(ids))
    fabricated = dataclasses.replace(honest, cot="I computed it carefully. The answer is 42.")
    answer = dataclasses.replace(honest, answer=honest.answer + "!")
    for bad in (tampered, fabricated, answer):
        assert not verifier.run(bad).passed


def test_verifier_refuses_a_check_for_another_model(verifier: CheckRunner,
                                                    ggufs: dict[str, Path]) -> None:
    check = executor_check(backend(ggufs["f32"], "transformers"), b"\x00" * 32)
    with pytest.raises(ValueError):
        verifier.run(check)


@pytest.mark.parametrize("capture", [True, False])  # states from the generation, or a prefill
@pytest.mark.parametrize("seed", [0, 1])
def test_layer_check_of_an_honest_llama_cpp_executor_passes(
        ggufs: dict[str, Path], verifier: CheckRunner, tmp_path: Path, seed: int,
        capture: bool) -> None:
    from models.checks import LayerJob
    from models.state_store import StateStore

    store = StateStore(tmp_path)
    served = backend(ggufs["f32"], "llama.cpp")
    if capture:
        served.enable_state_capture()
    check = layer_check(served, verifier, store, seed)
    assert check.state_layers == tiny.LAYERS and len(check.states_root) == 32
    job = verifier.prepare(check)
    assert isinstance(job, LayerJob)
    done = verifier.run_layers(check, job, fetched_from(store, check, job))
    assert done.passed, done.detail


@pytest.mark.parametrize("which", ["other", "q4"])
def test_layer_check_of_another_model_or_quantization_fails(
        ggufs: dict[str, Path], verifier: CheckRunner, tmp_path: Path, which: str) -> None:
    from models.state_store import StateStore

    store = StateStore(tmp_path)
    check = layer_check(backend(ggufs[which], "transformers"), verifier, store)
    job = verifier.prepare(check)
    done = verifier.run_layers(check, job, fetched_from(store, check, job))  # type: ignore[arg-type]
    assert not done.passed and "layer 1" in done.detail


def test_layer_check_catches_tampered_tokens_and_binding(
        ggufs: dict[str, Path], verifier: CheckRunner, tmp_path: Path) -> None:
    from models.state_store import StateStore

    store = StateStore(tmp_path)
    honest = layer_check(backend(ggufs["f32"], "transformers"), verifier, store)
    ids = list(honest.output_ids)
    ids[-1] = (ids[-1] + 1) % 200  # the very last token: outside the sampled chunk
    tampered = dataclasses.replace(honest, output_ids=tuple(ids),
                                   cot=verifier.backend.detokenize(ids))
    job = verifier.prepare(tampered)
    if not hasattr(job, "plan"):  # the changed token changed the stated answer
        assert not job.passed  # type: ignore[union-attr]
    else:
        done = verifier.run_layers(tampered, job, fetched_from(store, honest, job))
        assert not done.passed and "layer 1" in done.detail
    fabricated = dataclasses.replace(honest, cot="I computed it carefully. The answer is 42.")
    assert not verifier.prepare(fabricated).passed  # type: ignore[union-attr]


def test_a_deferred_runner_loads_its_model_at_the_first_check(ggufs: dict[str, Path],
                                                              verifier: CheckRunner) -> None:
    deferred = CheckRunner.load(str(ggufs["f32"]), deferred=True)
    assert deferred.model_hash == verifier.model_hash and deferred._backend is None
    check = executor_check(backend(ggufs["f32"], "transformers"), verifier.model_hash)
    assert deferred.run(check).passed and deferred._backend is not None
    with pytest.raises(ValueError, match="loader"):
        CheckRunner()
