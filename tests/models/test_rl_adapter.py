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
from protocol.rl.messages import RolloutJob, RolloutSampling  # noqa: E402

pytest.importorskip("llama_cpp")
torch.set_num_threads(1)

#: tiny f32 model on both sides: any gap is an export or naming bug, not arithmetic
F32_MISMATCH_KL = 1e-4


class TinyEnv:
    """A plug-in environment with short prompts (the tiny model has a 512-token context)."""

    size = 4

    def prompt(self, index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Add {index} and 2."}]

    def reward(self, prompt: int, completion: str) -> float:
        return 1.0 if str(prompt + 2) in completion else 0.0


def _policy(path: Path, seed: int = 0) -> Policy:
    from models.loader import load_backend

    return Policy(load_backend(str(path), backend="transformers"), rank=4, alpha=8.0, seed=seed)


def _perturb(policy: Policy, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, m in lora.lora_modules(policy.model):
            m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g) * scale)


def _export(policy: Policy, directory: Path, version: int) -> export_mod.AdapterFile:
    cfg = policy.model.config
    return export_mod.export_adapter(policy.state(), directory, version=version, alpha=policy.alpha,
                                     n_head=cfg.num_attention_heads, n_kv_head=cfg.num_key_value_heads)


def _job(version: int, seed: int = 5, temperature: float = 1.0) -> RolloutJob:
    return RolloutJob(job_id=bytes([version]) * 16, learner="learner", model="tiny",
                      policy_version=version, adapter_hash=b"", prompt_seed=seed,
                      dataset_size=TinyEnv.size, prompts=2, group_size=3,
                      sampling=RolloutSampling(temperature=temperature, top_p=1.0, max_tokens=12))


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
    policy = _policy(tiny_ggufs["f32"])
    assert len(policy.layers) == 2 * len(lora.TARGETS)
    seq = [TokenSeq((1, 2, 3), (4, 5, 6))]
    with torch.no_grad():
        adapted = policy.token_logprobs(seq)[0]
        base = policy.token_logprobs(seq, base=True)[0]
    assert torch.equal(adapted, base)
    _perturb(policy)
    with torch.no_grad():
        assert not torch.allclose(policy.token_logprobs(seq)[0], base)
        assert torch.equal(policy.token_logprobs(seq, base=True)[0], base)


def test_adapter_state_round_trips_and_rejects_a_wrong_shape(tiny_ggufs: dict[str, Path]) -> None:
    a, b = _policy(tiny_ggufs["f32"]), _policy(tiny_ggufs["f32"], seed=1)
    _perturb(a)
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

    policy = _policy(tiny_ggufs["f32"])
    exported = _export(policy, tmp_path, version=3)
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
    policy = _policy(tiny_ggufs["f32"])
    _perturb(policy)
    exported = _export(policy, tmp_path, version=1)
    worker = RolloutWorker(str(tiny_ggufs["f32"]), n_threads=1, keep=2)
    try:
        worker.add_adapter(1, exported.path, exported.sha256)
        result = worker.generate_group(_job(1), env, worker="w")
        assert result.policy_version == 1 and len(result.completions) == 6
        assert _kl(policy, result, env) < F32_MISMATCH_KL
        # the same completions are far less likely under the base model: the adapter acts
        base = worker.generate_group(_job(0), env, worker="w")
        assert base.policy_version == 0
        assert _kl(policy, base, env) > 100 * F32_MISMATCH_KL
        # hot-swap back to version 1 without reloading: same sampler seed, same tokens
        again = worker.generate_group(_job(1), env, worker="w")
        assert again.completions == result.completions
        # at another temperature both sides take log-probs of the tempered distribution
        cool = worker.generate_group(_job(1, temperature=0.5), env, worker="w")
        assert _kl(policy, cool, env, temperature=0.5) < F32_MISMATCH_KL
        assert _kl(policy, cool, env, temperature=1.0) > 100 * F32_MISMATCH_KL
    finally:
        worker.close()


def test_an_unpermuted_q_k_export_is_caught(tiny_ggufs: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from models.rl.rollout import RolloutWorker

    env = TinyEnv()
    policy = _policy(tiny_ggufs["f32"])
    _perturb(policy)
    monkeypatch.setattr(export_mod, "_permute", lambda w, n: w)
    wrong = _export(policy, tmp_path, version=1)
    worker = RolloutWorker(str(tiny_ggufs["f32"]), n_threads=1)
    try:
        worker.add_adapter(1, wrong.path, wrong.sha256)
        assert _kl(policy, worker.generate_group(_job(1), env, worker="w"), env) > 100 * F32_MISMATCH_KL
    finally:
        worker.close()


def test_the_worker_keeps_the_last_versions_and_refuses_unknown_ones(tiny_ggufs: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    from models.rl.rollout import RolloutWorker

    policy = _policy(tiny_ggufs["f32"])
    worker = RolloutWorker(str(tiny_ggufs["f32"]), n_threads=1, keep=2)
    try:
        for v in (1, 2, 3):
            _perturb(policy, scale=0.1 * v)
            f = _export(policy, tmp_path, version=v)
            worker.add_adapter(v, f.path, f.sha256)
            worker.use(v)
        assert worker.versions == [0, 2, 3]
        with pytest.raises(KeyError, match="version 1"):
            worker.use(1)
        with pytest.raises(ValueError, match="SHA-256"):
            worker.add_adapter(4, f.path, "ab" * 32)
    finally:
        worker.close()
