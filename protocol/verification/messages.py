"""Verification wire messages (tags 70-79) and the commitments they carry.

Commit-then-reveal around every task result, then sampled re-checks by verifiers:

==============  ====  ===========================  ==============================================
message         tag   signed by / domain           meaning
==============  ====  ===========================  ==============================================
TermsBody       70    requester / TERMS            "commit to your result, bound to my nonce hash"
Terms           71    unicast to executor          envelope of a TermsBody (follows the Assign)
CommitBody      72    executor / COMMIT            hash(answer, CoT, output ids, salt), Merkle
                                                   roots of the chunk fingerprints and of every
                                                   layer's hidden states, model hash
Commit          73    unicast to requester         envelope of a CommitBody
RevealRequest   74    requester -> executor        the commit window closed: reveal (nonce)
Reveal          75    executor -> requester        the signed Result, salt and output token ids
CheckBody       76    requester / CHECK            re-check sampled chunks of one result
CheckRequest    77    unicast to verifier          envelope of a CheckBody
VerdictBody     78    verifier / VERDICT           pass / fail / declined, with evidence hash
Verdict         79    unicast to requester         envelope of a VerdictBody
StatesRequest   80    verifier -> executor         open these leaves of your layer states
StateLeaf       81    executor -> verifier         one leaf and its Merkle proof
==============  ====  ===========================  ==============================================

``StatesRequest`` and ``StateLeaf`` travel on their own bulk stream (node/verification/state_streams.py),
one frame each, because a check needs ~1-2 MB of them; everything in them is bound by the
``states_root`` of the executor's signed commitment.

``RevealRequest`` and ``Reveal`` are unsigned wrappers: they travel on authenticated direct
streams, and everything in a ``Reveal`` is bound by the executor's signed commitment (the
``Result`` inside is itself signed for ``protocol.market.messages.RESULT_DOMAIN``). The pure rules that
tie these messages together (commitments, seeds, sampling, ranking) are in
protocol/verification/rules.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from crypto.envelope import Envelope
from protocol.agents.wire import MAX_SYSTEM_PROMPT_CHARS, MAX_TOOL_CALLS, ToolCallRecord
from protocol.codec import Message, limits, message
from protocol.market.messages import (
    HASH_LEN,
    MAX_ANSWER_CHARS,
    MAX_COT_CHARS,
    MAX_FINGERPRINT_BYTES,
    MAX_FINGERPRINTS,
    MAX_PEER_ID_LEN,
    MAX_TOKENS,
    TASK_ID_LEN,
    TaskSpec,
)

TERMS_DOMAIN = "symphony/verify/terms/v1"
COMMIT_DOMAIN = "symphony/verify/commit/v1"
CHECK_DOMAIN = "symphony/verify/check/v1"
VERDICT_DOMAIN = "symphony/verify/verdict/v1"

NONCE_LEN = 32
SALT_LEN = 32
#: output token ids travel packed as big-endian u32 (protocol.verification.rules.pack_ids)
ID_BYTES = 4
MAX_OUTPUT_TOKENS = MAX_TOKENS
MAX_ATTEMPT = 1 << 20
#: tokens per fingerprint chunk: the only value models/ produces today (TOPLOC uses 32)
MIN_CHUNK_TOKENS = 1
MAX_CHUNK_TOKENS = 1024
#: chunks one check request may carry
MAX_CHECK_CHUNKS = 16
#: commitments in one commit window (the seed covers all of them)
MAX_BATCH = 64
#: a Merkle proof is at most 64 steps of 33 bytes (side flag + sibling hash)
PROOF_STEP_BYTES = 1 + HASH_LEN
MAX_PROOF_BYTES = 64 * PROOF_STEP_BYTES
MAX_DETAIL = 128
MAX_ESCALATION_ROUND = 8
#: decoder layers a states commitment may cover
MAX_STATE_LAYERS = 1024
MAX_CHECK_MS = 10 * 60 * 1000


@message(70)
@dataclass(frozen=True, slots=True, kw_only=True)
class TermsBody(Message):
    task_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    requester: str = limits(max_len=MAX_PEER_ID_LEN)
    executor: str = limits(max_len=MAX_PEER_ID_LEN)
    #: hash of the requester's nonce; the nonce is revealed only after the commit window
    nonce_hash: bytes = limits(size=HASH_LEN)


@message(71)
@dataclass(frozen=True, slots=True, kw_only=True)
class Terms(Message):
    envelope: Envelope


@message(72)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommitBody(Message):
    task_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    executor: str = limits(max_len=MAX_PEER_ID_LEN)
    #: hash of the canonical TaskSpec the executor was assigned (the prompt it answered)
    spec_hash: bytes = limits(size=HASH_LEN)
    #: the requester's nonce hash from the Terms this commitment answers
    nonce_hash: bytes = limits(size=HASH_LEN)
    #: verification_rules.result_commitment(answer, CoT, output ids, salt, ...)
    commitment: bytes = limits(size=HASH_LEN)
    #: Merkle root over the per-chunk fingerprints (empty when there are none)
    fingerprint_root: bytes = limits(max_len=HASH_LEN)
    chunks: int = limits(lo=0, hi=MAX_FINGERPRINTS)
    chunk_tokens: int = limits(lo=MIN_CHUNK_TOKENS, hi=MAX_CHUNK_TOKENS)
    #: generated (output) tokens
    tokens: int = limits(lo=0, hi=MAX_OUTPUT_TOKENS)
    model_hash: bytes = limits(max_len=HASH_LEN)
    #: Merkle root over every decoder layer's output, in blocks of positions
    #: (models.layer_states); empty when the executor committed no layer states
    states_root: bytes = limits(max_len=HASH_LEN, default=b"")
    #: decoder layers those states cover (0 with no states)
    state_layers: int = limits(lo=0, hi=MAX_STATE_LAYERS, default=0)

    def check(self) -> None:
        if (self.state_layers == 0) != (self.states_root == b""):
            raise ValueError("a states root goes with a layer count, and only then")
        if self.states_root and len(self.states_root) != HASH_LEN:
            raise ValueError("states_root must be empty or 32 bytes")
        if (self.chunks == 0) != (self.fingerprint_root == b""):
            raise ValueError("a fingerprint root goes with at least one chunk, and only then")
        if self.fingerprint_root and len(self.fingerprint_root) != HASH_LEN:
            raise ValueError("fingerprint_root must be empty or 32 bytes")
        lo, hi = self.tokens // self.chunk_tokens, -(-self.tokens // self.chunk_tokens)
        if self.chunks and not lo <= self.chunks <= hi:
            raise ValueError(f"{self.chunks} chunks cannot cover {self.tokens} tokens "
                             f"of {self.chunk_tokens}")


@message(73)
@dataclass(frozen=True, slots=True, kw_only=True)
class Commit(Message):
    envelope: Envelope


@message(74)
@dataclass(frozen=True, slots=True, kw_only=True)
class RevealRequest(Message):
    repeatable: ClassVar[bool] = True
    task_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    nonce: bytes = limits(size=NONCE_LEN)


@message(75)
@dataclass(frozen=True, slots=True, kw_only=True)
class Reveal(Message):
    #: the commitment this reveal opens
    task_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    #: the executor's signed ``protocol.market.messages.Result`` envelope (RESULT_DOMAIN, ResultBody)
    result: Envelope
    salt: bytes = limits(size=SALT_LEN)
    output_ids: bytes = limits(max_len=MAX_OUTPUT_TOKENS * ID_BYTES)

    def check(self) -> None:
        if len(self.output_ids) % ID_BYTES:
            raise ValueError("output_ids must be whole u32 token ids")


@message(76)
@dataclass(frozen=True, slots=True, kw_only=True)
class CheckBody(Message):
    """One check: everything a verifier needs, each part bound to the executor's commitment.

    To the verifier it reads like a task (the same ``TaskSpec`` an executor is assigned)
    plus the claimed output; the executor under check is never contacted.
    """

    check_id: bytes = limits(size=HASH_LEN)
    requester: str = limits(max_len=MAX_PEER_ID_LEN)
    verifier: str = limits(max_len=MAX_PEER_ID_LEN)
    task: TaskSpec
    #: the executor's signed CommitBody
    commit: Envelope
    #: seed inputs: the requester's nonce and the content hashes of the window's commitments
    nonce: bytes = limits(size=NONCE_LEN)
    batch: tuple[bytes, ...] = limits(max_items=MAX_BATCH, size=HASH_LEN)
    answer: str = limits(max_len=MAX_ANSWER_CHARS)
    cot: str = limits(max_len=MAX_COT_CHARS)
    salt: bytes = limits(size=SALT_LEN)
    output_ids: bytes = limits(max_len=MAX_OUTPUT_TOKENS * ID_BYTES)
    #: sampled chunk indices (ascending), their fingerprints and Merkle proofs
    chunk_indices: tuple[int, ...] = limits(max_items=MAX_CHECK_CHUNKS, lo=0,
                                            hi=MAX_FINGERPRINTS - 1)
    fingerprints: tuple[bytes, ...] = limits(max_items=MAX_CHECK_CHUNKS,
                                             max_len=MAX_FINGERPRINT_BYTES)
    proofs: tuple[bytes, ...] = limits(max_items=MAX_CHECK_CHUNKS, max_len=MAX_PROOF_BYTES)
    #: 0 for the first verifiers of a result, then one per escalation
    round: int = limits(lo=0, hi=MAX_ESCALATION_ROUND)
    #: the requester stops waiting for the verdict after this long
    timeout_ms: int = limits(lo=1, hi=MAX_CHECK_MS)
    #: the result's agent context (ResultBody.system_prompt, .tool_calls): with the task, the
    #: text the executor's model read; bound to the commitment (rules.agent_context)
    system_prompt: str = limits(max_len=MAX_SYSTEM_PROMPT_CHARS, default="")
    tool_calls: tuple[ToolCallRecord, ...] = limits(max_items=MAX_TOOL_CALLS, default=())
    #: the result's LoRA adapter (ResultBody.adapter, bound to the commitment likewise)
    adapter: bytes = limits(max_len=HASH_LEN, default=b"")

    def check(self) -> None:
        if self.adapter and len(self.adapter) != HASH_LEN:
            raise ValueError(f"adapter must be empty or a {HASH_LEN}-byte content hash")
        n = len(self.chunk_indices)
        if len(self.fingerprints) != n or len(self.proofs) != n:
            raise ValueError("one fingerprint and one proof per sampled chunk")
        if list(self.chunk_indices) != sorted(set(self.chunk_indices)):
            raise ValueError("chunk indices must be ascending and distinct")
        if len(self.output_ids) % ID_BYTES:
            raise ValueError("output_ids must be whole u32 token ids")
        if any(len(p) % PROOF_STEP_BYTES for p in self.proofs):
            raise ValueError("a proof is whole 33-byte steps")


@message(77)
@dataclass(frozen=True, slots=True, kw_only=True)
class CheckRequest(Message):
    envelope: Envelope


class VerdictStatus(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    #: the verifier cannot check (model not served, busy, bad request): ask someone else
    DECLINED = "declined"


@message(78)
@dataclass(frozen=True, slots=True, kw_only=True)
class VerdictBody(Message):
    check_id: bytes = limits(size=HASH_LEN)
    task_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    executor: str = limits(max_len=MAX_PEER_ID_LEN)
    verifier: str = limits(max_len=MAX_PEER_ID_LEN)
    requester: str = limits(max_len=MAX_PEER_ID_LEN)
    status: VerdictStatus
    #: verification_rules.evidence_hash of what was checked (the same for every verifier)
    evidence_hash: bytes = limits(size=HASH_LEN)
    chunk_indices: tuple[int, ...] = limits(max_items=MAX_CHECK_CHUNKS, lo=0,
                                            hi=MAX_FINGERPRINTS - 1)
    detail: str = limits(max_len=MAX_DETAIL)


@message(79)
@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict(Message):
    envelope: Envelope


#: leaves one states request may ask for
MAX_STATE_LEAVES = 4_096
#: one leaf: a block of positions of one layer's float32 outputs (models.layer_states), with
#: room under the frame limit for its header and proof
MAX_STATE_LEAF_BYTES = (1 << 20) - 4_096


@message(80)
@dataclass(frozen=True, slots=True, kw_only=True)
class StatesRequest(Message):
    """Verifier -> executor, on the states stream: open these leaves of your commitment.

    The leaves are bound by the ``states_root`` of the executor's signed CommitBody, so asking
    for them tells the executor nothing it could still use: its commitment is already made.
    """
    repeatable: ClassVar[bool] = True

    task_id: bytes = limits(size=TASK_ID_LEN)
    states_root: bytes = limits(size=HASH_LEN)
    leaves: tuple[int, ...] = limits(max_items=MAX_STATE_LEAVES, lo=0, hi=(1 << 31) - 1)

    def check(self) -> None:
        if list(self.leaves) != sorted(set(self.leaves)):
            raise ValueError("leaf indices must be ascending and distinct")


#: StateLeaf refusals (negative indices): the executor never held the states asked for ...
STATES_NOT_HELD = -1
#: ... held them but dropped them, past the check window, to stay within its store's budget ...
STATES_EVICTED = -2
#: ... or will not serve this verifier now (over its per-peer quota)
STATES_BUSY = -3


@message(81)
@dataclass(frozen=True, slots=True, kw_only=True)
class StateLeaf(Message):
    """Executor -> verifier: one requested leaf and its Merkle proof (one frame each); a
    negative index with an empty leaf is a refusal instead: ``STATES_NOT_HELD`` (never kept),
    ``STATES_EVICTED`` (kept, then dropped once older than the check window) or
    ``STATES_BUSY`` (this verifier is over the executor's per-peer quota). What each one
    means for the check: protocol/verification/rules.py ``states_refusal_convicts``."""

    index: int = limits(lo=STATES_BUSY, hi=(1 << 31) - 1)
    leaf: bytes = limits(max_len=MAX_STATE_LEAF_BYTES)
    proof: bytes = limits(max_len=MAX_PROOF_BYTES)


#: which role's machine takes each verification message a peer sends: the requester's
#: verified auction, the executor's verified executor, the verifier (the daemon's verify
#: service and the simulator route by these same tuples; the states stream is the executor's
#: store's own protocol)
TO_REQUESTER: tuple[type[Message], ...] = (Commit, Reveal, Verdict)
TO_EXECUTOR: tuple[type[Message], ...] = (Terms, RevealRequest)
TO_VERIFIER: tuple[type[Message], ...] = (CheckRequest,)
