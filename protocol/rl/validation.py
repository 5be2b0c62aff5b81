"""Checks a learner runs on every returned group before it trains on it, without a model.

:func:`check_group` returns ``None`` when the result answers the job as asked, else a short
reason naming the first thing wrong (it becomes the detail of an attestation against the
worker, protocol/rl/attestations.py). It checks what needs no model:

* the result answers this job, for the job's policy version;
* its prompt indices are the ones the job's seed yields (a worker cannot pick easy prompts);
* it holds ``prompts x group_size`` completions;
* each completion has one log-probability per token, every token id is in the model's
  vocabulary, every log-probability is finite and in ``[MIN_LOGPROB, 0]``;
* lengths agree with sampling: at most ``max_tokens``, at least one token, and a completion
  marked as cut (not ``finished``) has exactly ``max_tokens``;
* the commitment opens: it is the Merkle root of the completions' fingerprints
  (:func:`rollout_commitment`), so the fingerprints are the ones the worker committed to.

The model-dependent checks (log-probabilities recomputed under version ``v`` within a mismatch
threshold, the fingerprints against the learner's recomputed activations, the token ids
decoding) belong to the learner's models code (models/rl/checks.py); it passes them to the job
book as extra checks of the same shape (``GroupCheck``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from crypto.merkle import merkle_root
from protocol.rl.messages import MIN_LOGPROB, Completion, RolloutJob, RolloutResultBody
from protocol.rl.prompts import job_prompts

#: a check over one returned group: None when it passes, else the reason it fails
GroupCheck = Callable[[RolloutJob, RolloutResultBody], "str | None"]


def _check_completion(c: Completion, max_tokens: int, vocab_size: int) -> str | None:
    n = len(c.token_ids)
    if n != len(c.logprobs):
        return f"{n} tokens but {len(c.logprobs)} log-probs"
    if n == 0:
        return "empty completion"
    if n > max_tokens:
        return f"{n} tokens exceed max_tokens {max_tokens}"
    if not c.finished and n != max_tokens:
        return f"cut at {n} tokens, not at max_tokens {max_tokens}"
    if any(not 0 <= t < vocab_size for t in c.token_ids):
        return f"token id outside the vocabulary of {vocab_size}"
    if any(not (math.isfinite(lp) and MIN_LOGPROB <= lp <= 0.0) for lp in c.logprobs):
        return "log-prob not finite or outside [MIN_LOGPROB, 0]"
    return None


def rollout_commitment(completions: Sequence[Completion]) -> bytes:
    """The commitment of a result: the Merkle root of its completions' fingerprints."""
    if not completions:
        raise ValueError("a rollout commitment needs at least one completion")
    return merkle_root([c.fingerprint for c in completions])


def check_group(job: RolloutJob, result: RolloutResultBody, *, vocab_size: int) -> str | None:
    """None when ``result`` answers ``job`` as asked (see the module doc), else the reason."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if result.job_id != job.job_id:
        return "result for another job"
    if result.policy_version != job.policy_version:
        return f"version {result.policy_version}, job asked {job.policy_version}"
    if result.prompt_indices != job_prompts(job):
        return "prompt indices do not match the job's seed"
    want = job.prompts * job.group_size
    if len(result.completions) != want:
        return f"{len(result.completions)} completions, job asked {want}"
    for i, completion in enumerate(result.completions):
        why = _check_completion(completion, job.sampling.max_tokens, vocab_size)
        if why is not None:
            return f"completion {i}: {why}"
    if result.commitment != rollout_commitment(result.completions):
        return "commitment does not open: not the Merkle root of the completions' fingerprints"
    return None
