"""Layer states taken inside a llama.cpp batch (models.batched with models.llama_capture's
batch callback): each sequence's rows land in its own buffer at its own positions, whatever
ubatches llama.cpp cut the batch into, so the fp32 verifier accepts them, and a committing
solver commits to a batched result with no second pass."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")
pytest.importorskip("llama_cpp")

from models import layer_states as ls  # noqa: E402
from models.backend import SamplingParams  # noqa: E402
from models.loader import load_backend  # noqa: E402
from tests.models import tiny  # noqa: E402

PROMPTS = ("<|im_start|>user\nhello the world, tell a story<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nthe story of the world, tell it<|im_end|>\n<|im_start|>assistant\n")
#: the middle sequence ends first, so the others' decode rounds skip its id: two ubatches
BUDGETS = (40, 12, 36)


def _in_order(decoder: Any) -> list[tuple[Any, Any]]:
    """The three generations, started one after another once the one before has sampled a
    token (so each takes the next sequence id)."""
    out: list[Any] = [None] * 3
    sampled = [threading.Event() for _ in range(3)]

    def run(i: int) -> None:
        params = SamplingParams(max_tokens=BUDGETS[i], temperature=0.9, seed=i, ignore_eos=True)
        out[i] = decoder.generate_states(PROMPTS[i], params, on_text=lambda _: sampled[i].set())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread, event in zip(threads, sampled, strict=True):
        thread.start()
        event.wait()
    for thread in threads:
        thread.join()
    return out


def test_batched_states_are_each_sequences_own(tiny_ggufs: dict[str, Path],
                                               tiny_hf: Any) -> None:
    backend = load_backend(str(tiny_ggufs["f32"]))
    decoder = backend.batched(3)
    try:
        assert decoder.keeps_states
        results = _in_order(decoder)
    finally:
        decoder.close()
    # the later two started on the chat template's opening the first had evaluated (copied
    # from its KV cells and kept states), so their states check that copy too
    assert decoder.reused >= 2 * len(backend.tokenize("<|im_start|>user\n"))
    from models.batched import HELD_STATES_IDS

    # the freed ids keep their prompts' cells, but only the newest keep states; how many ids
    # the three took depends on the threads' timing (a first generation done before the
    # second thread starts frees its id for it), so the count follows the ids used
    kept = [states for _, states in decoder._held.values() if states is not None]
    assert 1 <= len(decoder._held) <= 3
    assert len(kept) == min(HELD_STATES_IDS, len(decoder._held))
    for prompt_text, (gen, states) in zip(PROMPTS, results, strict=True):
        ids = list(gen.prompt_token_ids) + list(gen.token_ids)
        prompt = len(backend.tokenize(prompt_text))
        layers, final = states
        assert layers.shape == (tiny.LAYERS, len(ids), tiny.HIDDEN)
        assert final.shape == (len(ids), tiny.HIDDEN)
        ref, ref_final = ls.layer_states(tiny_hf, ids)
        tol = 2e-2 * np.abs(ref).max()
        np.testing.assert_allclose(layers[:-1], ref[:-1], rtol=0, atol=tol)
        # the last layer and the final norm only where logits were read: the prompt's last
        # position, and every output position (the last one evaluated after sampling ended)
        assert not layers[-1, :prompt - 1].any() and not final[:prompt - 1].any()
        np.testing.assert_allclose(layers[-1, prompt - 1:], ref[-1, prompt - 1:], rtol=0, atol=tol)
        np.testing.assert_allclose(final[prompt:], ref_final[prompt:], rtol=0,
                                   atol=2e-2 * np.abs(ref_final).max())
        plan = ls.plan_check(prompt, len(ids) - prompt, [0], 32, range(2, tiny.LAYERS + 1))
        checks = ls.check_layers(tiny_hf, ids, plan, ls.blocks_of(layers))
        assert all(c.ok for c in checks), checks


def test_a_decoder_without_kept_states_generates_the_same(tiny_ggufs: dict[str, Path]) -> None:
    backend = load_backend(str(tiny_ggufs["f32"]))
    decoder = backend.batched(2)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    try:
        gen, states = decoder.generate_states(PROMPTS[0], params)
        plain = decoder.generate(PROMPTS[0], params)
    finally:
        decoder.close()
    assert plain.token_ids == gen.token_ids and states is not None
    assert backend.generate(PROMPTS[0], params).token_ids == gen.token_ids


def test_a_committing_solver_commits_batched_results_without_a_second_pass(
        tiny_ggufs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from models.solver import ModelsSolver
    from models.state_store import StateStore
    from protocol.market.messages import Requirement, TaskSpec

    def no_second_pass(*_: Any) -> None:
        raise AssertionError("the commitment evaluated the tokens again")

    monkeypatch.setattr(ls, "layer_states", no_second_pass)
    backend = load_backend(str(tiny_ggufs["f32"]))
    monkeypatch.setattr(backend, "replay", no_second_pass)
    store = StateStore(tmp_path)
    solver = ModelsSolver(backend, temperature=0.8, fingerprints=True, states=store, slots=2)
    task = TaskSpec(task_id=b"\4" * 32, requester="rq", question="What is 6 * 7?",
                    answer_type="text", choices=(),
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=1.0, max_tokens=40)
    try:
        solver.models()  # turns the single context's capture on, as the executor does
        done = solver.solve(task, "tiny", 40)
        assert solver._batch is not None and solver._batch.decoded == 1
    finally:
        assert solver._batch is not None
        solver._batch.close()
    assert done.state_layers == tiny.LAYERS and len(done.states_root) == 32
    assert len(done.fingerprints) == -(-len(done.output_ids) // 32)
    assert store.leaves(task.task_id, done.states_root, [0])  # kept for the verifiers


def test_without_the_batch_callback_a_batched_result_is_committed_by_a_replay(
        tiny_ggufs: dict[str, Path], tmp_path: Path) -> None:
    from models.solver import ModelsSolver
    from models.state_store import StateStore
    from protocol.market.messages import Requirement, TaskSpec

    backend = load_backend(str(tiny_ggufs["f32"]))
    replayed: list[int] = []
    replay = backend.replay

    def counted(ids: Any) -> None:
        replayed.append(len(ids))
        replay(ids)

    backend.replay = counted  # type: ignore[method-assign]
    solver = ModelsSolver(backend, temperature=0.8, fingerprints=True,
                          states=StateStore(tmp_path), slots=2)
    assert solver._batch is not None
    held = solver._batch._capture  # its context still calls it (switched off)
    solver._batch._capture = None  # as where the callback cannot be built
    task = TaskSpec(task_id=b"\5" * 32, requester="rq", question="What is 6 * 7?",
                    answer_type="text", choices=(),
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=1.0, max_tokens=20)
    try:
        solver.models()
        done = solver.solve(task, "tiny", 20)
    finally:
        solver._batch.close()
    assert solver._batch.decoded == 1 and held is not None
    assert replayed == [done.prompt_tokens + len(done.output_ids)]
    assert done.state_layers == tiny.LAYERS and len(done.states_root) == 32
