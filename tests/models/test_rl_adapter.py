"""LoRA policy, adapter export to a llama.cpp LoRA GGUF, and hot-swap on a llama.cpp worker.

The check that matters: completions sampled by llama.cpp with an exported adapter have the
log-probabilities the torch policy recomputes (tiny f32 model: both sides compute the same
function), and a mis-exported adapter (Q/K rows not permuted) is caught by that comparison.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.rl import export as export_mod  # noqa: E402
from models.rl import lora  # noqa: E402
from models.rl.grpo import mismatch_kl  # noqa: E402
from models.rl.policy import Policy, TokenSeq  # noqa: E402
from tests.models.rl_tiny import TinyEnv, export_adapter, make_job, make_policy, perturb

pytest.importorskip("llama_cpp")
torch.set_num_threads(1)

#: tiny f32 model on both sides: any gap is an export or naming bug, not arithmetic
F32_MISMATCH_KL = 1e-4


def _kl(policy: Policy, result, env: TinyEnv, temperature: float = 1.0) -> float:  # type: ignore[no-untyped-def]
    g = result.completions
    per_prompt = len(g) // len(result.prompt_indices)
    seqs = [TokenSeq(policy.prompt_ids(env.prompt(result.prompt_indices[i // per_prompt])), c.token_ids)
            for i, c in enumerate(g)]
    with torch.no_grad():
        lps = policy.token_logprobs(seqs, temperature=temperature)
    reported = [x for c in g for x in c.logprobs]
    return mismatch_kl(reported, [x for lp in lps for x in lp.tolist()])


def test_a_fresh_adapter_computes_the_base_model(tiny_ggufs: dict[str, Path]) -> None:
    policy = make_policy(tiny_ggufs["f32"])
    assert len(policy.layers) == 2 * len(lora.TARGETS)
    seq = [TokenSeq((1, 2, 3), (4, 5, 6))]
    with torch.no_grad():
        adapted = policy.token_logprobs(seq)[0]
        base = policy.token_logprobs(seq, base=True)[0]
    assert torch.equal(adapted, base)
    perturb(policy)
    with torch.no_grad():
        assert not torch.allclose(policy.token_logprobs(seq)[0], base)
        assert torch.equal(policy.token_logprobs(seq, base=True)[0], base)


def test_adapter_state_round_trips_and_rejects_a_wrong_shape(tiny_ggufs: dict[str, Path]) -> None:
    a, b = make_policy(tiny_ggufs["f32"]), make_policy(tiny_ggufs["f32"], seed=1)
    perturb(a)
    b.load_state(a.state())
    for key, value in a.state().items():
        assert torch.equal(value, b.state()[key])
    bad = a.state()
    key = next(iter(bad))
    bad[key] = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="shape"):
        b.load_state(bad)
    with pytest.raises(ValueError, match="lacks"):
        b.load_state({})
    with pytest.raises(ValueError, match="already"):
        lora.apply_lora(a.model)


def test_the_gguf_adapter_follows_llama_cpp_naming(tiny_ggufs: dict[str, Path], tmp_path: Path) -> None:
    from models.gguf_torch import read_gguf

    policy = make_policy(tiny_ggufs["f32"])
    exported = export_adapter(policy, tmp_path, version=3)
    assert exported.path.name == f"{exported.sha256}.gguf"
    meta, tensors = read_gguf(exported.path)
    assert meta["general.type"] == "adapter" and meta["adapter.type"] == "lora"
    assert meta["adapter.lora.alpha"] == 8.0 and meta[export_mod.VERSION_KEY] == 3
    assert tensors["blk.0.attn_q.weight.lora_a"].shape == (4, 64)  # (r, in)
    assert tensors["blk.1.ffn_down.weight.lora_b"].shape == (64, 4)  # (out, r)
    assert len(tensors) == 2 * len(policy.layers)
    export_mod.verify_adapter(exported.path, exported.sha256)
    with pytest.raises(ValueError, match="SHA-256"):
        export_mod.verify_adapter(exported.path, "0" * 64)


def test_llama_cpp_with_the_adapter_matches_the_torch_policy(tiny_ggufs: dict[str, Path],
                                                             tmp_path: Path) -> None:
    from models.rl.rollout import RolloutWorker

    env = TinyEnv()
    policy = make_policy(tiny_ggufs["f32"])
    perturb(policy)
    exported = export_adapter(policy, tmp_path, version=1)
    worker = RolloutWorker(str(tiny_ggufs["f32"]), n_threads=1, keep=2)
    try:
        worker.add_adapter(1, exported.path, exported.sha256)
        result = worker.generate_group(make_job(1), env, worker="w")
        assert result.policy_version == 1 and len(result.completions) == 6
        assert _kl(policy, result, env) < F32_MISMATCH_KL
        # the same completions are far less likely under the base model: the adapter acts
        base = worker.generate_group(make_job(0), env, worker="w")
        assert base.policy_version == 0
        assert _kl(policy, base, env) > 100 * F32_MISMATCH_KL
        # hot-swap back to version 1 without reloading: same sampler seed, same tokens
        again = worker.generate_group(make_job(1), env, worker="w")
        assert again.completions == result.completions
        # at another temperature both sides take log-probs of the tempered distribution
        cool = worker.generate_group(make_job(1, temperature=0.5), env, worker="w")
        assert _kl(policy, cool, env, temperature=0.5) < F32_MISMATCH_KL
        assert _kl(policy, cool, env, temperature=1.0) > 100 * F32_MISMATCH_KL
    finally:
        worker.close()


def test_an_unpermuted_q_k_export_is_caught(tiny_ggufs: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from models.rl.rollout import RolloutWorker

    env = TinyEnv()
    policy = make_policy(tiny_ggufs["f32"])
    perturb(policy)
    monkeypatch.setattr(export_mod, "_permute", lambda w, n: w)
    wrong = export_adapter(policy, tmp_path, version=1)
    worker = RolloutWorker(str(tiny_ggufs["f32"]), n_threads=1)
    try:
        worker.add_adapter(1, wrong.path, wrong.sha256)
        assert _kl(policy, worker.generate_group(make_job(1), env, worker="w"), env) > 100 * F32_MISMATCH_KL
    finally:
        worker.close()


def test_the_worker_keeps_the_last_versions_and_refuses_unknown_ones(tiny_ggufs: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    from models.rl.rollout import RolloutWorker

    policy = make_policy(tiny_ggufs["f32"])
    worker = RolloutWorker(str(tiny_ggufs["f32"]), n_threads=1, keep=2)
    try:
        for v in (1, 2, 3):
            perturb(policy, scale=0.1 * v)
            f = export_adapter(policy, tmp_path, version=v)
            worker.add_adapter(v, f.path, f.sha256)
            worker.use(v)
        assert worker.versions == [0, 2, 3]
        with pytest.raises(KeyError, match="version 1"):
            worker.use(1)
        with pytest.raises(ValueError, match="SHA-256"):
            worker.add_adapter(4, f.path, "ab" * 32)
    finally:
        worker.close()
