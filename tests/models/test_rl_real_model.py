"""The validation thresholds on the real default model: honest llama.cpp (Q4_1) rollouts, with
and without an adapter, sit under MISMATCH_KL_MAX against the fp32 torch policy's recomputation
and their fingerprints open to its states, and confident forged log-probs sit far above it."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.rl.grpo import MISMATCH_KL_MAX, mismatch_kl  # noqa: E402
from protocol.rl.messages import RolloutJob, RolloutSampling  # noqa: E402

pytest.importorskip("llama_cpp")
torch.set_num_threads(1)


@pytest.mark.integration
def test_honest_rollouts_pass_and_forged_logprobs_fail(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from models.rl import lora
    from models.rl.checks import decode_problem, fingerprint_problem
    from models.rl.env import EvalsetEnvironment
    from models.rl.export import export_adapter
    from models.rl.policy import Policy, TokenSeq
    from models.rl.rollout import RolloutWorker

    env = EvalsetEnvironment()
    policy = Policy.load(n_threads=1)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # an adapter that moves the model noticeably, like a few steps would
        for _, m in lora.lora_modules(policy.model):
            m.lora_b.copy_(torch.randn(m.lora_b.shape, generator=g) * 0.005)
    cfg = policy.model.config
    adapter = export_adapter(policy.state(), tmp_path, version=1, alpha=policy.alpha,
                             n_head=cfg.num_attention_heads, n_kv_head=cfg.num_key_value_heads)
    worker = RolloutWorker(n_threads=1)
    try:
        worker.add_adapter(1, adapter.path, adapter.sha256)
        for version in (0, 1):
            job = RolloutJob(job_id=bytes([version + 1]) * 16, learner="l", model="m",
                             policy_version=version, adapter_hash=b"", prompt_seed=11,
                             dataset_size=env.size, prompts=1, group_size=2,
                             sampling=RolloutSampling(temperature=0.7, top_p=1.0, max_tokens=16))
            result = worker.generate_group(job, env, worker="w")
            prompt = policy.prompt_ids(env.prompt(result.prompt_indices[0]))
            seqs = [TokenSeq(prompt, c.token_ids) for c in result.completions]
            with torch.no_grad():
                if version == 0:
                    with lora.adapters_disabled(policy.model):
                        lps, states = policy.logprobs_and_states(seqs, temperature=0.7)
                else:
                    lps, states = policy.logprobs_and_states(seqs, temperature=0.7)
            # the Q4_1 worker's fingerprints open to the fp32 states, its ids decode
            for c, h in zip(result.completions, states, strict=True):
                assert fingerprint_problem(h.numpy(), c) is None
                assert decode_problem(policy, c) is None
            recomputed = [x for lp in lps for x in lp.tolist()]
            reported = [x for c in result.completions for x in c.logprobs]
            honest = mismatch_kl(reported, recomputed)
            forged = mismatch_kl([-0.05] * len(reported), recomputed)
            print(f"version {version}: honest mismatch KL {honest:.4g}, forged {forged:.4g}")
            assert honest < MISMATCH_KL_MAX < forged
    finally:
        worker.close()
