"""Task-market wire messages (tags 40-69): tasks, beacons, bids, assignments, results.

Everything a node asserts in the market is signed. A signed message is a wire message holding
one ``Envelope`` whose payload is the canonical encoding of a ``*Body`` message; the receiver
verifies the envelope for its domain, decodes the payload bytes as received (never
re-encoding first) and checks that the signer is who the body says it is
(``protocol.envelopes.open_authored``). Unsigned messages (``Reject``, ``Cancel``) only ever travel on an
authenticated direct stream, where the transport already proves the sender.

Times on the wire are durations relative to sending (``*_ms``), never instants: nodes do not
share a clock. Each receiver turns them into instants on its own clock at receipt.

==========  ======  =======================  =================================================
message     tag     signed by / domain       meaning
==========  ======  =======================  =================================================
Requirement 40      (nested)                 model, minimum context; the need (text, skills,
                                             agent) and the requester's vector of it
TaskSpec    41      (nested in AssignBody)   the task: question, answer type, k, budget
BeaconBody  42      requester / BEACON       "who can do this task?" (round, bid window)
Beacon      43      gossip                   envelope of a BeaconBody
BidBody     44      bidder / BID             agent, match score, price, latency, load, hold
Bid         45      unicast to requester     envelope of a BidBody
AssignBody  46      requester / ASSIGN       the task, to one executor, with a deadline
Assign      47      unicast to executor      envelope of an AssignBody
ResultBody  48      executor / RESULT        answer, CoT, confidence, tokens, model, prints,
                                             agent, its tool calls and system prompt
Result      49      unicast to requester     envelope of a ResultBody
Reject      50      executor -> requester    refuses an assignment or reports a failure
Cancel      51      requester -> executor    drop the assignment / release the reservation
Turn        52      (nested in TaskSpec)     one earlier turn of a conversation
==========  ======  =======================  =================================================

A task names how its prompt is built (``TaskSpec.style``): ``cot`` asks for a chain of
thought ending in a final-answer line (what voting compares), ``chat`` sends the
conversation as it is (the reply is the answer), ``plain`` sends the question as raw text
with no chat template (a completion), ``plan`` asks a planner for a plan, generated under
the plan grammar (protocol/agents/plans.py; the reply is the plan's JSON). The requester also fixes the sampling (temperature,
top-p, a seed base and stop strings); each executor derives its own seed from the seed base
and its attempt (protocol.market.sampling), so the k executors of a task sample k different
chains and anyone holding the task can recompute any executor's seed.

Agents (protocol/agents/wire.py): a requirement may say what the task needs (text, skill
tags, or an agent by name); a bid and an assignment name the agent of the bidder's node that
answers, and the result names it with the tool calls it made and the system prompt it used,
which is the text its model read besides the task. Every agent field is defaulted: a task
that names no need is matched by model, as before agents.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from crypto.envelope import Envelope
from protocol.agents.wire import (
    MAX_AGENT_NAME_LEN,
    MAX_EMBEDDING_DIM,
    MAX_NEED_SKILLS,
    MAX_NEEDS_CHARS,
    MAX_SKILL_LEN,
    MAX_SYSTEM_PROMPT_CHARS,
    MAX_TOOL_CALLS,
    ToolCallRecord,
    check_need,
)
from protocol.codec import Message, limits, message

BEACON_DOMAIN = "symphony/task-beacon/v1"
BID_DOMAIN = "symphony/task-bid/v1"
ASSIGN_DOMAIN = "symphony/task-assign/v1"
RESULT_DOMAIN = "symphony/task-result/v1"
#: short gossip topic name for beacons (the driver adds the network id)
BEACON_TOPIC = "tasks-beacon"

TASK_ID_LEN = 32
HASH_LEN = 32
MAX_PEER_ID_LEN = 64
MAX_MODEL_NAME = 64
MAX_QUESTION_CHARS = 8192
MAX_ANSWER_TYPE_LEN = 16
MAX_CHOICES = 16
MAX_CHOICE_LEN = 256
MAX_ANSWER_CHARS = 1024
#: a CoT longer than this is refused on the wire; executors truncate theirs below it
MAX_COT_CHARS = 32_768
#: what an executor appends to a CoT it truncates
COT_TRUNCATION_MARK = "\n[... truncated]"
MAX_REASON_LEN = 128
MAX_K = 16
MAX_TOKENS = 32_768
MAX_CONTEXT = 1 << 22
MAX_PRICE = 1e9
#: the longest task and the longest bid window, in milliseconds
MAX_TASK_MS = 24 * 3600 * 1000
MAX_WINDOW_MS = 10 * 60 * 1000
MAX_ROUND = 64
MAX_ATTEMPT = 1 << 20
#: activation fingerprints a result carries (for verifiers that re-compute chunks)
MAX_FINGERPRINTS = 512
MAX_FINGERPRINT_BYTES = 1024
MAX_LATENCY_MS = MAX_TASK_MS
MAX_SLOTS = 1024
#: earlier turns of a conversation a task carries, and the roles a turn may have
MAX_TURNS = 64
TURN_ROLES = ("system", "user", "assistant")
TASK_STYLES = ("cot", "chat", "plain", "plan")
MAX_STOP = 4
MAX_STOP_CHARS = 64
MAX_TEMPERATURE = 2.0
MAX_SEED = (1 << 63) - 1
MAX_FINISH_REASON = 16


@message(40)
@dataclass(frozen=True, slots=True, kw_only=True)
class Requirement(Message):
    """What a task needs. Empty ``model`` and ``family`` mean "any model"; empty ``needs``,
    ``skills`` and ``agent`` mean "any agent" (matched by model, as before agents)."""

    model: str = limits(max_len=MAX_MODEL_NAME)
    family: str = limits(max_len=MAX_MODEL_NAME)
    min_context: int = limits(lo=0, hi=MAX_CONTEXT)
    #: what the task needs, as text, and as normalized skill tags
    needs: str = limits(max_len=MAX_NEEDS_CHARS, default="")
    skills: tuple[str, ...] = limits(max_items=MAX_NEED_SKILLS, max_len=MAX_SKILL_LEN,
                                     default=())
    #: only this agent (by name) may answer; "" = any
    agent: str = limits(max_len=MAX_AGENT_NAME_LEN, default="")
    #: the requester's embedding of ``needs`` (int8 and scale, protocol.agents.matching) and
    #: its embedder's hash, so bidders pick their best agent without embedding
    need_embedding: bytes = limits(max_len=MAX_EMBEDDING_DIM, default=b"")
    need_scale: float = limits(lo=0.0, hi=1.0, default=0.0)
    embedder_hash: bytes = limits(max_len=HASH_LEN, default=b"")

    def check(self) -> None:
        check_need(self)


@message(52)
@dataclass(frozen=True, slots=True, kw_only=True)
class Turn(Message):
    """One earlier turn of a conversation: who said it and what."""

    role: str = limits(max_len=16)
    content: str = limits(max_len=MAX_QUESTION_CHARS)

    def check(self) -> None:
        if self.role not in TURN_ROLES:
            raise ValueError(f"turn role must be one of {TURN_ROLES}")


@message(41)
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec(Message):
    task_id: bytes = limits(size=TASK_ID_LEN)
    requester: str = limits(max_len=MAX_PEER_ID_LEN)
    question: str = limits(max_len=MAX_QUESTION_CHARS)
    #: a ``protocol.answers.AnswerType`` value
    answer_type: str = limits(max_len=MAX_ANSWER_TYPE_LEN)
    choices: tuple[str, ...] = limits(max_items=MAX_CHOICES, max_len=MAX_CHOICE_LEN)
    requirement: Requirement
    k: int = limits(lo=1, hi=MAX_K)
    #: the most the requester pays one executor for this task
    max_price: float = limits(lo=0.0, hi=MAX_PRICE)
    max_tokens: int = limits(lo=1, hi=MAX_TOKENS)
    #: how the prompt is built: "cot", "chat" or "plain" (see the top of this module)
    style: str = limits(max_len=8, default="cot")
    #: the conversation before ``question`` (the last user turn), oldest first
    history: tuple[Turn, ...] = limits(max_items=MAX_TURNS, default=())
    #: sampling every executor uses; temperature 0 is greedy
    temperature: float = limits(lo=0.0, hi=MAX_TEMPERATURE, default=0.0)
    top_p: float = limits(lo=0.0, hi=1.0, default=1.0)
    #: the requester's seed base, from which each executor's seed is derived
    seed: int = limits(lo=0, hi=MAX_SEED, default=0)
    #: generation ends once the text holds one of these
    stop: tuple[str, ...] = limits(max_items=MAX_STOP, max_len=MAX_STOP_CHARS, default=())

    def check(self) -> None:
        if self.style not in TASK_STYLES:
            raise ValueError(f"style must be one of {TASK_STYLES}")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE}]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be in [0, {MAX_SEED}]")
        if any(not s for s in self.stop):
            raise ValueError("a stop string must not be empty")
        if sum(len(t.content) for t in self.history) + len(self.question) > MAX_QUESTION_CHARS * 4:
            raise ValueError("the conversation is too long")


@message(42)
@dataclass(frozen=True, slots=True, kw_only=True)
class BeaconBody(Message):
    task_id: bytes = limits(size=TASK_ID_LEN)
    requester: str = limits(max_len=MAX_PEER_ID_LEN)
    #: 0 for the first beacon of a task; a replan beacon for the same task counts up
    round: int = limits(lo=0, hi=MAX_ROUND)
    requirement: Requirement
    #: executors still wanted in this round
    wanted: int = limits(lo=1, hi=MAX_K)
    max_price: float = limits(lo=0.0, hi=MAX_PRICE)
    max_tokens: int = limits(lo=1, hi=MAX_TOKENS)
    #: the beacon's TTL: bids later than this after sending are not wanted
    bid_window_ms: int = limits(lo=1, hi=MAX_WINDOW_MS)
    #: time left for the whole task when sent
    deadline_ms: int = limits(lo=1, hi=MAX_TASK_MS)
    allow_self: bool


@message(43)
@dataclass(frozen=True, slots=True, kw_only=True)
class Beacon(Message):
    envelope: Envelope


@message(44)
@dataclass(frozen=True, slots=True, kw_only=True)
class BidBody(Message):
    task_id: bytes = limits(size=TASK_ID_LEN)
    round: int = limits(lo=0, hi=MAX_ROUND)
    bidder: str = limits(max_len=MAX_PEER_ID_LEN)
    model: str = limits(max_len=MAX_MODEL_NAME)
    model_hash: bytes = limits(max_len=HASH_LEN)
    #: how well the bidder's model fits the requirement, in [0, 1]
    match_score: float = limits(lo=0.0, hi=1.0)
    price: float = limits(lo=0.0, hi=MAX_PRICE)
    #: queue wait plus generation time from measured tokens/s
    est_latency_ms: int = limits(lo=0, hi=MAX_LATENCY_MS)
    #: busy fraction of the bidder's slots, in [0, 1]
    load: float = limits(lo=0.0, hi=1.0)
    free_slots: int = limits(lo=0, hi=MAX_SLOTS)
    #: how long the bidder holds a slot for this bid
    hold_ms: int = limits(lo=1, hi=MAX_WINDOW_MS)
    #: the bidder's agent that would answer ("" for a node that names none)
    agent: str = limits(max_len=MAX_AGENT_NAME_LEN, default="")


@message(45)
@dataclass(frozen=True, slots=True, kw_only=True)
class Bid(Message):
    envelope: Envelope


@message(46)
@dataclass(frozen=True, slots=True, kw_only=True)
class AssignBody(Message):
    task: TaskSpec
    executor: str = limits(max_len=MAX_PEER_ID_LEN)
    #: unique per task; a result names the attempt it answers
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    round: int = limits(lo=0, hi=MAX_ROUND)
    model: str = limits(max_len=MAX_MODEL_NAME)
    #: time the executor has to return its result, from sending
    deadline_ms: int = limits(lo=1, hi=MAX_TASK_MS)
    #: the agent the bid named
    agent: str = limits(max_len=MAX_AGENT_NAME_LEN, default="")
    #: someone follows a k=1 task's text as it is generated, so the executor streams it
    #: (protocol/market/progress.py); False: only the signed result is wanted
    stream: bool = limits(default=True)


@message(47)
@dataclass(frozen=True, slots=True, kw_only=True)
class Assign(Message):
    envelope: Envelope


@message(48)
@dataclass(frozen=True, slots=True, kw_only=True)
class ResultBody(Message):
    task_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    executor: str = limits(max_len=MAX_PEER_ID_LEN)
    answer: str = limits(max_len=MAX_ANSWER_CHARS)
    cot: str = limits(max_len=MAX_COT_CHARS)
    confidence: float = limits(lo=0.0, hi=1.0)
    tokens: int = limits(lo=0, hi=MAX_TOKENS * 4)
    compute_ms: int = limits(lo=0, hi=MAX_TASK_MS)
    #: content hash identifying the exact model weights used
    model_hash: bytes = limits(max_len=HASH_LEN)
    #: per-chunk activation fingerprints, and their Merkle root (empty when not computed)
    fingerprints: tuple[bytes, ...] = limits(
        max_items=MAX_FINGERPRINTS, max_len=MAX_FINGERPRINT_BYTES
    )
    fingerprint_root: bytes = limits(max_len=HASH_LEN)
    #: tokens of the prompt the executor's model read
    prompt_tokens: int = limits(lo=0, hi=MAX_CONTEXT, default=0)
    #: "stop" (the model ended, or a stop string), or "length" (max_tokens cut it)
    finish_reason: str = limits(max_len=MAX_FINISH_REASON, default="stop")
    #: the agent that answered (the assignment's), the tool calls it made in order, and its
    #: system prompt as used ("" = the default prompt): with the task, the text its model read
    agent: str = limits(max_len=MAX_AGENT_NAME_LEN, default="")
    tool_calls: tuple[ToolCallRecord, ...] = limits(max_items=MAX_TOOL_CALLS, default=())
    system_prompt: str = limits(max_len=MAX_SYSTEM_PROMPT_CHARS, default="")
    #: the content hash of the LoRA adapter the agent ran on (its card's ``adapter``; b"" =
    #: the base model): bound to the commitment, it is what a verifier applies to re-check
    adapter: bytes = limits(max_len=HASH_LEN, default=b"")

    def check(self) -> None:
        if self.adapter and len(self.adapter) != HASH_LEN:
            raise ValueError(f"adapter must be empty or a {HASH_LEN}-byte content hash")


@message(49)
@dataclass(frozen=True, slots=True, kw_only=True)
class Result(Message):
    envelope: Envelope


class RejectReason(enum.Enum):
    NOT_BID = "not_bid"  # assigned a task we hold no reservation for
    EXPIRED = "expired"  # the reservation or the task deadline passed
    OVER_LIMITS = "over_limits"  # question, tokens or deadline beyond our limits
    NO_SLOT = "no_slot"
    BAD_ASSIGN = "bad_assign"  # malformed, forged or addressed to someone else
    DUPLICATE = "duplicate"
    COMPUTE_FAILED = "compute_failed"


@message(50)
@dataclass(frozen=True, slots=True, kw_only=True)
class Reject(Message):
    task_id: bytes = limits(size=TASK_ID_LEN)
    attempt: int = limits(lo=0, hi=MAX_ATTEMPT)
    reason: RejectReason
    detail: str = limits(max_len=MAX_REASON_LEN)


@message(51)
@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(Message):
    task_id: bytes = limits(size=TASK_ID_LEN)
    #: the attempt to cancel, or -1 for "release any reservation for this task"
    attempt: int = limits(lo=-1, hi=MAX_ATTEMPT)
