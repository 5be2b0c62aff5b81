"""Rollout-job wire messages (tags 140-159): the learner's jobs and the workers' results.

A rollout job asks a worker for ``group_size`` completions of each of ``prompts`` prompts,
sampled with the learner's policy at ``policy_version``. The prompts are not named by the
learner but derived from ``prompt_seed`` (protocol/rl/prompts.py), so that both sides agree on
them and a worker cannot choose easy ones. The result carries every completion as token ids
with their per-token log-probabilities under that version and its activation fingerprint, the
compute time and the worker's verification commitment (the fingerprints' Merkle root). Rewards never travel: the learner computes them.

Signed messages follow the market's pattern (protocol/market/messages.py): a wire message
holding one ``Envelope`` whose payload is a ``*Body``; the receiver opens it with
``protocol.envelopes.open_authored``. Bids are the market's own ``BidBody`` (its ``task_id``
is the job id), signed in their own domain and carried in a ``RolloutBid`` so that the daemon
routes them to its learner, not to its task market; selection, reputation and LinUCB apply
unchanged. Times on the wire are durations (``*_ms``) from sending.

=================  ===  ======================  ==========================================
message            tag  signed by / domain      meaning
=================  ===  ======================  ==========================================
RolloutSampling    140  (nested)                temperature, top-p, max tokens
RolloutJob         141  (nested)                model, version, prompt seed, G, sampling
RolloutBeaconBody  142  learner / RL_BEACON     "who can run this job?" (round, window)
RolloutBeacon      143  gossip                  envelope of a RolloutBeaconBody
RolloutAssignBody  144  learner / RL_ASSIGN     the job, to one worker, with a deadline
RolloutAssign      145  unicast to worker       envelope of a RolloutAssignBody
Completion         146  (nested)                token ids, their log-probs, finished flag
RolloutResultBody  147  worker / RL_RESULT      the completions of every prompt, in order
RolloutResult      148  unicast to learner      envelope of a RolloutResultBody
RolloutReject      149  worker -> learner       refuses an assignment or reports a failure
RolloutBid         150  worker / RL_BID         envelope of a market ``BidBody`` for a job
RolloutCancel      151  learner -> worker       release a bid's slot, or stop a running job
=================  ===  ======================  ==========================================
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from crypto.envelope import Envelope
from protocol.codec import Message, limits, message
from protocol.market.messages import (
    HASH_LEN,
    MAX_MODEL_NAME,
    MAX_PEER_ID_LEN,
    MAX_PRICE,
    MAX_REASON_LEN,
    MAX_ROUND,
    MAX_TASK_MS,
    MAX_WINDOW_MS,
    TASK_ID_LEN,
)

RL_BEACON_DOMAIN = "symphony/rl-beacon/v1"
RL_ASSIGN_DOMAIN = "symphony/rl-assign/v1"
RL_RESULT_DOMAIN = "symphony/rl-result/v1"
RL_BID_DOMAIN = "symphony/rl-bid/v1"
#: short gossip topic name for rollout beacons (the driver adds the network id)
RL_BEACON_TOPIC = "rl-beacon"

MAX_VERSION = (1 << 31) - 1
MAX_SEED = (1 << 63) - 1
MAX_DATASET = 1 << 24
MAX_PROMPTS_PER_JOB = 16
MAX_GROUP = 64
MAX_COMPLETION_TOKENS = 4096
#: token ids on the wire; the learner checks them against its model's real vocabulary
MAX_VOCAB = 1 << 20
#: the lowest log-probability a sampled token may carry (exp(-1000) is never sampled)
MIN_LOGPROB = -1000.0
#: a completion's fingerprint: 2 header bytes and 4 bytes per entry, at most 4 per token
MAX_FINGERPRINT_LEN = 2 + 16 * MAX_COMPLETION_TOKENS
MAX_TEMPERATURE = 4.0
#: every token of a result together; keeps a result frame (~14 bytes a token) under 1 MiB
MAX_RESULT_TOKENS = 32_768
MAX_ATTEMPT = 1 << 20


@message(140)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutSampling(Message):
    temperature: float = limits(lo=0.0, hi=MAX_TEMPERATURE)
    top_p: float = limits(lo=0.0, hi=1.0)
    max_tokens: int = limits(lo=1, hi=MAX_COMPLETION_TOKENS)

    def check(self) -> None:
        if self.top_p <= 0.0:
            raise ValueError("top_p must be > 0")


@message(141)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutJob(Message):
    job_id: bytes = limits(size=TASK_ID_LEN)
    learner: str = limits(max_len=MAX_PEER_ID_LEN)
    model: str = limits(max_len=MAX_MODEL_NAME)
    policy_version: int = limits(lo=0, hi=MAX_VERSION)
    #: content address of the version's adapter (empty: the base model, version 0)
    adapter_hash: bytes = limits(max_len=HASH_LEN)
    prompt_seed: int = limits(lo=0, hi=MAX_SEED)
    #: prompts are indices into the learner's environment of this many prompts
    dataset_size: int = limits(lo=1, hi=MAX_DATASET)
    prompts: int = limits(lo=1, hi=MAX_PROMPTS_PER_JOB)
    group_size: int = limits(lo=1, hi=MAX_GROUP)
    sampling: RolloutSampling

    def check(self) -> None:
        if self.prompts > self.dataset_size:
            raise ValueError(f"{self.prompts} prompts from a dataset of {self.dataset_size}")
        if self.prompts * self.group_size * self.sampling.max_tokens > MAX_RESULT_TOKENS:
            raise ValueError(f"prompts x group x max_tokens exceeds {MAX_RESULT_TOKENS}")


@message(142)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutBeaconBody(Message):
    job: RolloutJob
    round: int = limits(lo=0, hi=MAX_ROUND)
    max_price: float = limits(lo=0.0, hi=MAX_PRICE)
    bid_window_ms: int = limits(lo=1, hi=MAX_WINDOW_MS)
    #: time left for the whole job when sent
    deadline_ms: int = limits(lo=1, hi=MAX_TASK_MS)


@message(143)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutBeacon(Message):
    envelope: Envelope


@message(144)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutAssignBody(Message):
    job: RolloutJob
    worker: str = limits(max_len=MAX_PEER_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    round: int = limits(lo=0, hi=MAX_ROUND)
    #: time the worker has to return its result, from sending
    deadline_ms: int = limits(lo=1, hi=MAX_TASK_MS)


@message(145)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutAssign(Message):
    envelope: Envelope


@message(146)
@dataclass(frozen=True, slots=True, kw_only=True)
class Completion(Message):
    token_ids: tuple[int, ...] = limits(max_items=MAX_COMPLETION_TOKENS, lo=0, hi=MAX_VOCAB - 1)
    #: log-probability of each token under the job's policy version
    logprobs: tuple[float, ...] = limits(max_items=MAX_COMPLETION_TOKENS, lo=MIN_LOGPROB,
                                         hi=0.0)
    #: True when generation stopped by itself, False when cut at ``max_tokens``
    finished: bool
    #: the worker's activation fingerprint of this completion: the final-norm hidden state's
    #: largest entries at every token (models/fingerprint.py's blob, one over all the tokens);
    #: the result's ``commitment`` is the Merkle root of these
    fingerprint: bytes = limits(max_len=MAX_FINGERPRINT_LEN, default=b"")

    def check(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")


@message(147)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutResultBody(Message):
    job_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    worker: str = limits(max_len=MAX_PEER_ID_LEN)
    policy_version: int = limits(lo=0, hi=MAX_VERSION)
    prompt_indices: tuple[int, ...] = limits(max_items=MAX_PROMPTS_PER_JOB, lo=0,
                                             hi=MAX_DATASET - 1)
    #: ``group_size`` completions of the first prompt, then of the second, ...
    completions: tuple[Completion, ...] = limits(max_items=MAX_PROMPTS_PER_JOB * MAX_GROUP)
    compute_ms: int = limits(lo=0, hi=MAX_TASK_MS)
    #: the worker's verification commitment: the Merkle root of the completions'
    #: fingerprints, in order (protocol/rl/validation.py's ``rollout_commitment``)
    commitment: bytes = limits(max_len=HASH_LEN)
    #: content hash of the exact weights used (base model with the version's adapter)
    model_hash: bytes = limits(max_len=HASH_LEN)

    def check(self) -> None:
        tokens = sum(len(c.token_ids) for c in self.completions)
        if tokens > MAX_RESULT_TOKENS:
            raise ValueError(f"{tokens} tokens exceed {MAX_RESULT_TOKENS}")


@message(148)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutResult(Message):
    envelope: Envelope


class RolloutRejectReason(enum.Enum):
    NOT_BID = "not_bid"  # assigned a job we hold no reservation for
    OTHER_VERSION = "other_version"  # we do not hold the job's policy version
    OTHER_MODEL = "other_model"
    EXPIRED = "expired"
    OVER_LIMITS = "over_limits"
    BAD_ASSIGN = "bad_assign"  # malformed, forged or addressed to someone else
    COMPUTE_FAILED = "compute_failed"


@message(149)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutReject(Message):
    job_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    reason: RolloutRejectReason
    detail: str = limits(max_len=MAX_REASON_LEN)


@message(150)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutBid(Message):
    """A market ``BidBody`` (``task_id`` = the job id) signed in ``RL_BID_DOMAIN``."""

    envelope: Envelope


@message(151)
@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutCancel(Message):
    """Unsigned: it only travels on the authenticated stream from the job's learner."""

    job_id: bytes = limits(size=TASK_ID_LEN)
    #: the attempt to stop, or -1 for "release the slot your bid holds"
    attempt: int = limits(lo=-1, hi=MAX_ATTEMPT)
