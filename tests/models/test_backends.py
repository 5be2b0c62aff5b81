import numpy as np
import pytest
import torch

from models.backend import SamplingParams, measure_throughput, render_chat
from models.loader import load_backend
from tests.models import tiny

PROMPT = "<|im_start|>user\nhello the world<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tiny_llama(tiny_ggufs):
    pytest.importorskip("llama_cpp")
    backend = load_backend(str(tiny_ggufs["f32"]))
    yield backend
    backend.close()


def test_gguf_loader_equals_in_memory_model(tiny_hf):
    model = tiny.tiny_model(seed=0)  # what the GGUF was written from
    ids = torch.tensor([tiny_hf.tokenize(PROMPT)])
    with torch.no_grad():
        assert torch.equal(tiny_hf.model(ids).logits, model(ids).logits)


def test_greedy_is_deterministic_and_consistent_with_score(tiny_hf):
    a = tiny_hf.generate(PROMPT, SamplingParams(max_tokens=12))
    b = tiny_hf.generate(PROMPT, SamplingParams(max_tokens=12))
    assert a.token_ids == b.token_ids and len(a.token_ids) == len(a.logprobs) > 0
    assert a.text == tiny_hf.detokenize(a.token_ids)
    np.testing.assert_allclose(tiny_hf.score(a.prompt_token_ids, a.token_ids), a.logprobs, atol=1e-4)


def test_sampling_depends_on_seed_only(tiny_hf):
    runs = [tiny_hf.generate(PROMPT, SamplingParams(max_tokens=8, temperature=1.0, seed=s)).token_ids
            for s in (1, 1, 2)]
    assert runs[0] == runs[1] != runs[2]


def test_llama_cpp_matches_transformers_on_same_gguf(tiny_llama, tiny_hf):
    assert tiny_llama.tokenize(PROMPT) == tiny_hf.tokenize(PROMPT)
    g = tiny_llama.generate(PROMPT, SamplingParams(max_tokens=12))
    assert g.token_ids == tiny_hf.generate(PROMPT, SamplingParams(max_tokens=12)).token_ids
    np.testing.assert_allclose(tiny_llama.score(g.prompt_token_ids, g.token_ids), g.logprobs, atol=1e-3)
    np.testing.assert_allclose(tiny_hf.score(g.prompt_token_ids, g.token_ids), g.logprobs, atol=1e-2)
    assert tiny_llama.identity_hash == tiny_hf.identity_hash


def test_chat_messages_and_throughput(tiny_llama):
    msgs = [{"role": "user", "content": "hi"}]
    assert render_chat(None, msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    g = tiny_llama.generate(msgs, SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(g.token_ids) == 4 and g.finish_reason == "length"
    assert measure_throughput(tiny_llama, n_tokens=8) > 0
