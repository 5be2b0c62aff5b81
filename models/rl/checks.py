"""The learner's model checks of a returned rollout group, beside the log-prob recomputation.

protocol/rl/validation.py checks what needs no model (prompts, counts, lengths, the commitment
opening to the completions' fingerprints). Here, with the learner's policy:

* **token ids decode** (:func:`decode_problem`, every completion): an end-of-turn token only as
  the last token and exactly when the completion says it finished (a sampler stops there),
  and the text decodes round trip (``detokenize(tokenize(text)) == text``): the text the
  environment rewards is the text of these ids.
* **fingerprints** (:func:`fingerprint_problem`): each completion's blob covers exactly its
  tokens (every completion), and for the completions the learner recomputes, the claimed
  final-norm entries agree with the policy's own states under the group's version, from the
  same forward pass as the log-probs (no extra computation).

Tolerances, measured on SmolLM2-135M (24 completions of 24 tokens, versions 0 and 1, T = 0.7):
a worker's llama.cpp Q4_1 states against the learner's fp32 torch recomputation differ by a
mean relative error (models.fingerprint's ``|got - claimed| / (|claimed| + 0.05)``) of
0.007-0.0175 per completion, at most 0.10 for one entry, with no claimed index outside the
recomputed top-k; another model's states are off by ~1. The bounds are about three times the
honest figures. The fingerprint of this model (its two largest final-norm entries per token,
~20 in size, the same few channels at most positions) hardly moves with a small adapter: it
binds a result to this base model and these tokens, while the version is the log-prob check's.
"""

from __future__ import annotations

import numpy as np

from models.fingerprint import VALUE_FLOOR, blob_positions, decode_chunk
from models.rl.policy import Policy
from protocol.rl.messages import Completion

#: a completion's mean relative error over its claimed entries must stay under this ...
FINGERPRINT_MEAN_REL_MAX = 0.05
#: ... no entry may be further off than this ...
FINGERPRINT_ENTRY_REL_MAX = 0.5
#: ... and a claimed index must be within this of the recomputed k-th largest magnitude
RANK_SLACK = 0.1


def decode_problem(policy: Policy, c: Completion) -> str | None:
    """None when the completion's token ids decode as an honest sample's do, else why not."""
    ids, eos = c.token_ids, policy.eos_ids
    if c.finished != (bool(ids) and ids[-1] in eos):
        return ("marked finished without an end-of-turn token last" if c.finished
                else "ends with an end-of-turn token but is marked cut")
    body = ids[:-1] if c.finished else ids
    if any(t in eos for t in body):
        return "an end-of-turn token inside the completion"
    text = policy.detokenize(body)
    if policy.backend.detokenize(policy.backend.tokenize(text)) != text:
        return "token ids do not decode round trip"
    return None


def fingerprint_shape_problem(c: Completion) -> str | None:
    """None when the fingerprint blob covers exactly the completion's tokens."""
    if not c.fingerprint:
        return "no fingerprint"
    if blob_positions(c.fingerprint) != len(c.token_ids):
        return (f"fingerprint covers {blob_positions(c.fingerprint)} positions, "
                f"the completion has {len(c.token_ids)} tokens")
    return None


def fingerprint_problem(states: np.ndarray, c: Completion) -> str | None:
    """Compare a completion's fingerprint with the recomputed final-norm states (T, C) at
    its tokens' positions; None when they agree within the measured tolerances."""
    shape = fingerprint_shape_problem(c)
    if shape is not None:
        return shape
    idx, claimed = decode_chunk(c.fingerprint)
    if idx.shape[0] != states.shape[0] or int(idx.max(initial=0)) >= states.shape[1]:
        return "fingerprint indices outside the model's hidden size"
    got = np.take_along_axis(states, idx, axis=1)  # (T, k)
    rel = np.abs(got - claimed) / (np.abs(claimed) + VALUE_FLOOR)
    k = idx.shape[1]
    kth = -np.partition(-np.abs(states), k - 1, axis=1)[:, k - 1:k]
    if not np.all(np.isfinite(rel)) or float(rel.mean()) > FINGERPRINT_MEAN_REL_MAX:
        return (f"fingerprint disagrees with recomputation (mean relative error "
                f"{float(rel.mean()):.3g} > {FINGERPRINT_MEAN_REL_MAX:g})")
    if float(rel.max()) > FINGERPRINT_ENTRY_REL_MAX:
        return f"a fingerprint entry is off by {float(rel.max()):.3g} relative"
    if int((np.abs(got) < (1.0 - RANK_SLACK) * kth).sum()):
        return "fingerprint claims entries that are not the largest when recomputed"
    return None
