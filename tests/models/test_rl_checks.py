"""The learner's model checks of rollouts (models/rl/checks.py) on the tiny model: an honest
llama.cpp worker's fingerprints open to the torch policy's states under the adapter, another
model's and fabricated ones do not, and token ids that could not come from a sampler fail the
decode check."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")

import torch  # noqa: E402

from models.rl.checks import decode_problem, fingerprint_problem, fingerprint_shape_problem  # noqa: E402
from models.rl.policy import TokenSeq  # noqa: E402
from protocol.rl.validation import rollout_commitment  # noqa: E402
from tests.models.rl_tiny import TinyEnv, export_adapter, make_job, make_policy, perturb  # noqa: E402

pytest.importorskip("llama_cpp")
torch.set_num_threads(1)


def _states(policy, result, env):  # type: ignore[no-untyped-def]
    per_prompt = len(result.completions) // len(result.prompt_indices)
    seqs = [TokenSeq(policy.prompt_ids(env.prompt(result.prompt_indices[i // per_prompt])),
                     c.token_ids) for i, c in enumerate(result.completions)]
    with torch.no_grad():
        return [h.numpy() for h in policy.logprobs_and_states(seqs)[1]]


def test_fingerprints_open_only_for_the_model_and_version_that_made_them(
        tiny_ggufs: dict[str, Path], tmp_path: Path) -> None:
    from models.rl.rollout import RolloutWorker

    env = TinyEnv()
    policy = make_policy(tiny_ggufs["f32"])
    perturb(policy)
    adapter = export_adapter(policy, tmp_path, version=1)
    honest = RolloutWorker(str(tiny_ggufs["f32"]), n_threads=1)
    other = RolloutWorker(str(tiny_ggufs["other"]), n_threads=1)
    try:
        honest.add_adapter(1, adapter.path, adapter.sha256)
        result = honest.generate_group(make_job(1), env, worker="w")
        assert result.commitment == rollout_commitment(result.completions)
        states = _states(policy, result, env)
        for c, h in zip(result.completions, states, strict=True):
            assert fingerprint_shape_problem(c) is None and fingerprint_problem(h, c) is None
            assert decode_problem(policy, c) is None
        forged = other.generate_group(make_job(0), env, worker="w")
        reasons = [fingerprint_problem(h, c) for c, h in
                   zip(forged.completions, _states(policy, forged, env), strict=True)]
        assert all(r is not None for r in reasons), reasons
        first = result.completions[0]
        assert "covers" in str(fingerprint_shape_problem(replace(first, fingerprint=first.fingerprint[:-4])))
        assert fingerprint_shape_problem(replace(first, fingerprint=b"")) == "no fingerprint"
    finally:
        honest.close()
        other.close()


def test_token_ids_that_no_sampler_returns_fail_to_decode(tiny_ggufs: dict[str, Path]) -> None:
    from protocol.rl.messages import Completion

    policy = make_policy(tiny_ggufs["f32"])
    eos = min(policy.eos_ids)
    text = policy.prompt_ids([{"role": "user", "content": "hello there"}])[-4:]
    ok = Completion(token_ids=(*text, eos), logprobs=(-1.0,) * 5, finished=True)
    assert decode_problem(policy, ok) is None
    assert "marked finished" in str(decode_problem(policy, replace(ok, token_ids=text + text[:1])))
    assert "marked cut" in str(decode_problem(policy, replace(ok, finished=False)))
    inside = replace(ok, token_ids=(text[0], eos, *text[1:], eos))
    assert "inside" in str(decode_problem(policy, inside))
