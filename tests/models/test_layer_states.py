"""Per-layer state commitments (models.layer_states): honest reruns pass, every kind of
cheating that changes a layer's computation fails, and the leaf encoding is strict."""

import numpy as np
import pytest

from models import layer_states as ls
from models.backend import SamplingParams
from models.loader import load_backend

PROMPT = "<|im_start|>user\nhello the world, tell a story<|im_end|>\n<|im_start|>assistant\n"


def _run(backend, seed, n=80):
    g = backend.generate(PROMPT, SamplingParams(max_tokens=n, temperature=1.0, seed=seed,
                                                ignore_eos=True))
    return list(g.prompt_token_ids), list(g.token_ids)


_leaves = ls.blocks_of


@pytest.fixture(scope="module")
def backends(tiny_ggufs, tiny_hf):
    return {"f32": tiny_hf,
            "q4": load_backend(str(tiny_ggufs["q4"]), backend="transformers"),
            "other": load_backend(str(tiny_ggufs["other"]), backend="transformers")}


def test_leaf_round_trip_and_bad_leaves_are_refused():
    s = np.random.default_rng(0).standard_normal((32, 24)).astype(np.float32)
    blob = ls.encode_leaf(3, 7, s)
    layer, block, back = ls.decode_leaf(blob)
    assert (layer, block) == (3, 7) and np.array_equal(back, s)
    nan = s.copy()
    nan[0, 0] = np.nan
    for bad in (b"", blob[:-1], bytes([9]) + blob[1:], ls.encode_leaf(1, 0, nan)):
        with pytest.raises(ValueError):
            ls.decode_leaf(bad)


def test_plan_covers_the_chunk_and_only_what_attention_needs():
    plan = ls.plan_check(prompt_tokens=40, output_tokens=100, chunks=[1], chunk_tokens=32,
                         layers=[1, 5, 5, 2])
    # chunk 1 = positions 72..103 (blocks 2 and 3); attention needs positions 0..103
    assert plan.positions == tuple(range(72, 104)) and plan.end == 104
    assert plan.layers == (2, 5)
    need = ls.needed_leaves(plan)
    assert {(1, b) for b in range(1, 5)} <= set(need)  # layer 1 on the output (40..139)
    assert (1, 0) in need  # ... and as layer 2's input
    assert {(4, b) for b in range(4)} <= set(need) and (4, 4) not in need
    assert {(5, 2), (5, 3)} <= set(need) and (5, 0) not in need
    with pytest.raises(ValueError):
        ls.plan_check(40, 100, [4], 32, [2])  # no chunk 4 in 100 tokens
    two = ls.plan_check(40, 100, [0, 2], 32, [3])  # positions 40..71 and 104..135
    assert two.positions == tuple(range(40, 72)) + tuple(range(104, 136)) and two.end == 136


def test_a_layer_on_some_rows_equals_the_whole_layer(backends):
    prompt, out = _run(backends["f32"], 8)
    states, _ = ls.layer_states(backends["f32"], prompt + out)
    x = states[0]
    whole = ls.recompute_layer(backends["f32"], 2, x)
    rows = [0, 5, len(x) - 3, len(x) - 1]
    np.testing.assert_allclose(ls.recompute_layer(backends["f32"], 2, x, rows), whole[rows],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(whole, states[1], rtol=1e-5, atol=1e-5)


def test_states_match_the_models_own_forward(backends):
    prompt, out = _run(backends["f32"], 0)
    states, final = ls.layer_states(backends["f32"], prompt + out)
    assert states.shape[0] == ls.num_layers(backends["f32"])
    np.testing.assert_allclose(final, backends["f32"].hidden_states([prompt + out])[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_honest_rerun_passes_every_chunk_and_layer(backends, seed, threads):
    prompt, out = _run(backends["f32"], seed)
    states, _ = ls.layer_states(backends["f32"], prompt + out)
    fetched = _leaves(states)
    L = states.shape[0]
    import torch  # the backends fixture has skipped already where torch is missing

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for chunk in range(3):
            plan = ls.plan_check(len(prompt), len(out), [chunk], 32, range(2, L + 1))
            checks = ls.check_layers(backends["f32"], prompt + out, plan, fetched)
            assert [c.layer for c in checks] == list(range(1, L + 1))
            assert all(c.ok for c in checks), checks
            assert max(c.worst_err for c in checks) < ls.MAX_LAYER_ERR / 10  # real margin
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("cheat", ["q4", "other"])
def test_states_of_another_quantization_or_model_fail_every_layer(backends, cheat):
    prompt, out = _run(backends["f32"], 3)
    states, _ = ls.layer_states(backends[cheat], prompt + out)
    L = states.shape[0]
    plan = ls.plan_check(len(prompt), len(out), [1], 32, range(2, L + 1))
    checks = ls.check_layers(backends["f32"], prompt + out, plan, _leaves(states))
    assert not any(c.ok for c in checks), checks


@pytest.mark.parametrize("where", ["prompt", "early_output", "last_output"])
def test_an_altered_token_anywhere_fails_layer_one(backends, where):
    prompt, out = _run(backends["f32"], 5)
    states, _ = ls.layer_states(backends["f32"], prompt + out)
    ids = prompt + out
    pos = {"prompt": 2, "early_output": len(prompt) + 1, "last_output": len(ids) - 1}[where]
    ids[pos] = (ids[pos] + 1) % 40
    plan = ls.plan_check(len(prompt), len(out), [0], 32, [2])  # the first chunk only
    checks = ls.check_layers(backends["f32"], ids, plan, _leaves(states))
    assert not checks[0].ok and "layer 1" in checks[0].reason


def test_one_faked_layer_is_caught_when_sampled(backends):
    prompt, out = _run(backends["f32"], 6)
    states, _ = ls.layer_states(backends["f32"], prompt + out)
    skipped = states.copy()
    skipped[1] = skipped[0]  # layer 2 skipped: its output is its input
    fetched = _leaves(skipped)
    plan = ls.plan_check(len(prompt), len(out), [1], 32, [2])
    assert not ls.check_layers(backends["f32"], prompt + out, plan, fetched)[1].ok
    plan = ls.plan_check(len(prompt), len(out), [1], 32, [])  # layer 2 not sampled: unseen
    assert all(c.ok for c in ls.check_layers(backends["f32"], prompt + out, plan, fetched))


def test_missing_leaves_are_an_error_not_a_pass(backends):
    prompt, out = _run(backends["f32"], 7)
    states, _ = ls.layer_states(backends["f32"], prompt + out)
    fetched = _leaves(states)
    plan = ls.plan_check(len(prompt), len(out), [1], 32, [2])
    del fetched[(1, 0)]
    with pytest.raises(ValueError, match="not fetched"):
        ls.check_layers(backends["f32"], prompt + out, plan, fetched)
