import time

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.backend import SamplingParams, measure_throughput, render_chat  # noqa: E402
from models.loader import load_backend  # noqa: E402
from tests.models import tiny  # noqa: E402

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


def test_a_stop_string_ends_generation_at_the_token_completing_it(tiny_hf):
    free = tiny_hf.generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True))
    stop = free.text[len(free.text) // 2:len(free.text) // 2 + 2]
    assert stop.strip(), "the tiny model's text should have a visible middle"
    cut = tiny_hf.generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True, stop=(stop,)))
    assert cut.finish_reason == "stop" and stop in cut.text
    assert stop not in tiny_hf.detokenize(cut.token_ids[:-1])  # the last token completed it
    assert cut.token_ids == free.token_ids[:len(cut.token_ids)] and len(cut.token_ids) < 24
    assert cut.text == tiny_hf.detokenize(cut.token_ids)


def test_llama_cpp_matches_transformers_on_same_gguf(tiny_llama, tiny_hf):
    assert tiny_llama.tokenize(PROMPT) == tiny_hf.tokenize(PROMPT)
    g = tiny_llama.generate(PROMPT, SamplingParams(max_tokens=12))
    assert g.token_ids == tiny_hf.generate(PROMPT, SamplingParams(max_tokens=12)).token_ids
    np.testing.assert_allclose(tiny_llama.score(g.prompt_token_ids, g.token_ids), g.logprobs, atol=1e-3)
    np.testing.assert_allclose(tiny_hf.score(g.prompt_token_ids, g.token_ids), g.logprobs, atol=1e-2)
    assert tiny_llama.identity_hash == tiny_hf.identity_hash


def test_chat_messages_and_throughput(tiny_llama, tiny_hf, monkeypatch):
    msgs = [{"role": "user", "content": "hi"}]
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(None, msgs) == prompt
    g = tiny_llama.generate(msgs, SamplingParams(max_tokens=4, ignore_eos=True))
    assert g.prompt_token_ids == tuple(tiny_llama.tokenize(prompt))  # through the template
    reference = tiny_hf.generate(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    assert g.token_ids == reference.token_ids and g.text == tiny_llama.detokenize(g.token_ids)
    assert len(g.token_ids) == 4 and g.finish_reason == "length"

    made = []  # what measure_throughput generated, to check its figure against
    generate = tiny_llama.generate

    def recording(*args, **kwargs):
        made.append(generate(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tiny_llama, "generate", recording)
    started = time.perf_counter()
    tps = measure_throughput(tiny_llama, n_tokens=8)
    wall_s = time.perf_counter() - started
    (gen,) = made
    assert len(gen.token_ids) == 8 and gen.finish_reason == "length"  # EOS does not cut it short
    assert gen.token_ids == tiny_hf.generate(gen.prompt_token_ids, SamplingParams(
        max_tokens=8, ignore_eos=True)).token_ids  # greedy
    assert 0 < gen.generate_ms and gen.prompt_ms + gen.generate_ms <= wall_s * 1000
    assert tps == pytest.approx(8 / (gen.generate_ms / 1000))  # generated tokens per second
