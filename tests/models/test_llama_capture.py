"""Layer states taken from llama.cpp's own generation (models.llama_capture): the same tokens as
without capture, states that the fp32 verifier accepts, a cheaper quantization's states that
it refuses, and commitments that need no second computation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

from models import layer_states as ls  # noqa: E402
from models.backend import SamplingParams  # noqa: E402
from models.loader import load_backend  # noqa: E402
from tests.models import tiny  # noqa: E402

pytest.importorskip("llama_cpp")

PROMPT = "<|im_start|>user\nhello the world, tell a story<|im_end|>\n<|im_start|>assistant\n"


def capturing(path: Path) -> Any:
    backend = load_backend(str(path))
    backend.enable_state_capture()
    return backend


def generate(backend: Any, seed: int, n: int = 70) -> list[int]:
    g = backend.generate(PROMPT, SamplingParams(max_tokens=n, temperature=1.0, seed=seed,
                                                ignore_eos=True))
    return list(g.prompt_token_ids) + list(g.token_ids)


@pytest.fixture(scope="module")
def served(tiny_ggufs: dict[str, Path]) -> Any:
    return capturing(tiny_ggufs["f32"])


def test_capture_changes_nothing_generated_and_covers_every_position(
        served: Any, tiny_ggufs: dict[str, Path], tiny_hf: Any) -> None:
    plain = load_backend(str(tiny_ggufs["f32"]))
    ids = generate(served, 3)
    assert generate(plain, 3) == ids
    prompt = len(served.tokenize(PROMPT))
    assert served.llm.n_tokens == len(ids) - 1  # cut at its length: the last token unevaluated
    states, final = served.captured_states(ids)  # evaluates it
    assert states.shape == (tiny.LAYERS, len(ids), tiny.HIDDEN) and final.shape == (len(ids),
                                                                                    tiny.HIDDEN)
    ref, ref_final = ls.layer_states(tiny_hf, ids)
    # llama.cpp keeps keys and values in f16: close to the fp32 prefill, not equal
    np.testing.assert_allclose(states[:-1], ref[:-1], rtol=0, atol=2e-2 * np.abs(ref).max())
    # the last layer and the final norm run only where logits are read: not at the prompt
    # (but its last position), everywhere in the output
    assert not states[-1, :prompt - 1].any() and not final[:prompt - 1].any()
    np.testing.assert_allclose(states[-1, prompt - 1:], ref[-1, prompt - 1:], rtol=0,
                               atol=2e-2 * np.abs(ref).max())
    np.testing.assert_allclose(final[prompt:], ref_final[prompt:], rtol=0,
                               atol=2e-2 * np.abs(ref_final).max())


def test_states_of_other_tokens_are_not_returned(served: Any) -> None:
    ids = generate(served, 4)
    other = list(ids)
    other[2] = (other[2] + 1) % 40
    assert served.captured_states(other) is None
    assert served.captured_states(ids[:-5]) is None  # not what the context last evaluated
    assert served.captured_states(ids) is not None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_captured_states_pass_the_fp32_check(served: Any, tiny_hf: Any, seed: int) -> None:
    ids = generate(served, seed)
    prompt = len(served.tokenize(PROMPT))
    states, _ = served.captured_states(ids)
    for chunk in range(2):
        plan = ls.plan_check(prompt, len(ids) - prompt, [chunk], 32, range(2, tiny.LAYERS + 1))
        checks = ls.check_layers(tiny_hf, ids, plan, ls.blocks_of(states))
        assert all(c.ok for c in checks), checks
        assert max(c.worst_err for c in checks) < ls.MAX_LAYER_ERR / 4  # a real margin


def test_a_cheaper_quantizations_captured_states_fail(served: Any, tiny_ggufs: dict[str, Path],
                                                      tiny_hf: Any) -> None:
    ids = generate(served, 5)
    prompt = len(served.tokenize(PROMPT))
    cheap = capturing(tiny_ggufs["q4"])
    cheap._start(ids[:prompt])  # the honest tokens, through the Q4_0 weights
    for token in ids[prompt:-1]:
        cheap._step(token)
    states, _ = cheap.captured_states(ids)
    plan = ls.plan_check(prompt, len(ids) - prompt, [0], 32, range(2, tiny.LAYERS + 1))
    checks = ls.check_layers(tiny_hf, ids, plan, ls.blocks_of(states))
    assert not any(c.ok for c in checks), checks


def test_commitments_from_a_capturing_backend_run_no_prefill(
        served: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from models.commitments import commitments_for
    from models.state_store import StateStore

    ids = generate(served, 6)
    prompt = len(served.tokenize(PROMPT))

    def no_prefill(*_: Any) -> None:
        raise AssertionError("the commitment ran a prefill")

    monkeypatch.setattr(ls, "layer_states", no_prefill)
    made = commitments_for(served, ids[:prompt], ids[prompt:], StateStore(tmp_path), b"\1" * 32)
    assert made.state_layers == tiny.LAYERS and len(made.states_root) == 32
    assert [len(b) for b in made.fingerprints][:-1] == [258] * (len(made.fingerprints) - 1)


def test_a_committing_solver_captures_and_commits_without_a_prefill(
        tiny_ggufs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from models.solver import ModelsSolver
    from models.state_store import StateStore
    from protocol.market.messages import Requirement, TaskSpec

    def no_prefill(*_: Any) -> None:
        raise AssertionError("the commitment ran a prefill")

    monkeypatch.setattr(ls, "layer_states", no_prefill)
    task = TaskSpec(task_id=b"\4" * 32, requester="rq", question="What is 6 * 7?",
                    answer_type="text", choices=(),
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=1.0, max_tokens=60)
    solver = ModelsSolver(load_backend(str(tiny_ggufs["f32"])), temperature=0.8,
                          fingerprints=True, states=StateStore(tmp_path))
    sol = solver.solve(task, "tiny", 60)
    assert solver.backend.capture is not None
    assert sol.state_layers == tiny.LAYERS and len(sol.states_root) == 32
    assert len(sol.fingerprints) == -(-len(sol.output_ids) // 32)


def test_a_rollback_overwrites_the_positions_it_reevaluates(served: Any, tiny_hf: Any) -> None:
    ids = generate(served, 7, n=40)
    served.llm.n_tokens = len(ids) - 10  # drop the last positions, as a rollback does ...
    other = ids[:-10] + [(t + 7) % 40 for t in ids[-10:]]  # ... and go on with other tokens
    for token in other[-10:-1]:
        served._step(token)
    again, _ = served.captured_states(other)
    ref, _ = ls.layer_states(tiny_hf, other)
    np.testing.assert_allclose(again[:-1], ref[:-1], rtol=0, atol=2e-2 * np.abs(ref).max())


def test_a_prompt_sharing_the_last_ones_opening_evaluates_only_the_rest(
        tiny_ggufs: dict[str, Path]) -> None:
    """The prefill reuses the cached prefix (a chat template's opening, a system prompt):
    the same tokens, logprobs and layer states as a fresh context's, fewer tokens evaluated."""
    warm, fresh = capturing(tiny_ggufs["f32"]), capturing(tiny_ggufs["f32"])
    other = PROMPT.replace("tell a story", "sing a song")
    shared = len(os.path.commonprefix([warm.tokenize(PROMPT), warm.tokenize(other)]))
    assert 0 < shared < len(warm.tokenize(other)) - 1
    generate(warm, 3)  # the cache now holds PROMPT and a generation after it
    evaluated: list[int] = []
    real_eval = warm.llm.eval
    warm.llm.eval = lambda tokens: (evaluated.append(len(tokens)), real_eval(tokens))[1]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=4, ignore_eos=True)
    got, want = warm.generate(other, params), fresh.generate(other, params)
    assert evaluated[0] == len(got.prompt_token_ids) - shared
    assert (got.token_ids, got.logprobs) == (want.token_ids, want.logprobs)
    ids = list(got.prompt_token_ids) + list(got.token_ids)
    for mine, theirs in zip(warm.captured_states(ids), fresh.captured_states(ids), strict=True):
        np.testing.assert_array_equal(mine, theirs)
