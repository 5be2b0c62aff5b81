"""Inputs and outputs of the task-market machines besides wire messages.

The requester's ``Auction`` takes an ``AuctionConfig`` and the local events ``SubmitTask``,
``RestoreTask``, ``CancelTask`` and ``Reward``; it returns ``TaskUpdated`` (store / show a
snapshot) and ``Attest`` (an observation for the ledger) besides the common effects. The
``Executor`` returns ``StartCompute`` / ``CancelCompute`` and takes ``ComputeDone`` /
``ComputeFailed`` back. Drivers (node/ and simulations/) perform and produce these.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.agents.wire import ToolCallRecord
from protocol.codec import MAX_FRAME_BYTES
from protocol.market.messages import MAX_COT_CHARS, TaskSpec, Turn
from protocol.market.state import TaskSnapshot

#: ``Attest.kind`` for task outcomes, and its outcomes about an executor's work on one task
TASK_ATTEST = "task"
COMPLETED, WRONG, FAILED, TIMEOUT = "completed", "wrong", "failed", "timeout"


@dataclass(frozen=True, slots=True)
class AuctionConfig:
    bid_window_ms: int = 1_500
    #: close early once this many bids beyond the wanted count are in (and no better match
    #: may still come: protocol/market/bidding.py)
    spare_bids: int = 1
    #: once the wanted count of bids is in, wait at most this much longer for better ones
    #: (protocol/market/bidding.py says why)
    close_grace_ms: int = 150
    #: bid rounds per task that brought bids: the first one plus replans (rounds in which
    #: nobody bid do not count; protocol/market/rounds.py)
    max_rounds: int = 4
    #: the wait before a round that follows a bidless round, doubled for each such round in
    #: a row, at most ``backoff_max_ms`` (protocol/market/rounds.py)
    backoff_base_ms: int = 1_000
    backoff_max_ms: int = 8_000
    #: do not open a new round with less time than this left before the deadline
    min_round_ms: int = 1_000
    assign_base_ms: int = 2_000
    assign_slack: float = 3.0
    max_bids_per_task: int = 64
    bid_rate: int = 32
    rate_window_ms: int = 1_000
    max_open_tasks: int = 256
    max_cot_chars: int = MAX_COT_CHARS
    min_match: float = 0.0
    #: give the selector a reward (1 agreed with the vote, 0 otherwise) when voting
    reward_on_vote: bool = True
    fail_on_disconnect: bool = True
    keep_finished_ms: int = 10 * 60 * 1000
    max_frame: int = MAX_FRAME_BYTES


@dataclass(frozen=True, slots=True)
class SubmitTask:
    question: str
    answer_type: str
    deadline_ms: int
    k: int = 3
    choices: tuple[str, ...] = ()
    model: str = ""
    family: str = ""
    min_context: int = 0
    max_price: float = 1e6
    max_tokens: int = 512
    allow_self: bool = False
    #: None: the auction draws one from its rng
    task_id: bytes | None = None
    #: how the prompt is built and the conversation before the question (TaskSpec)
    style: str = "cot"
    history: tuple[Turn, ...] = ()
    #: sampling; temperature None: protocol.market.sampling.default_temperature(k)
    temperature: float | None = None
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    #: what the task needs (protocol/agents/wire.py): text and its embedding by the
    #: requester's embedder (int8 and scale, and the embedder's hash), skill tags, an agent
    needs: str = ""
    skills: tuple[str, ...] = ()
    agent: str = ""
    need_embedding: bytes = b""
    need_scale: float = 0.0
    embedder_hash: bytes = b""
    #: a part of a larger task (a plan's planners and steps, protocol/agents/pipeline.py):
    #: its own vote neither attests nor rewards the selector, the larger task's vote does
    deferred: bool = False
    #: peers never to assign this task (a replanning asks a planner not asked before)
    exclude: tuple[str, ...] = ()
    #: someone follows a k=1 task's text as it is generated (its executor streams it, at a
    #: cost on the executor's cores); False: the asker waits for the whole answer
    stream: bool = True


@dataclass(frozen=True, slots=True)
class KeptResult:
    """A result stored before a restart, with the bid's match score."""

    envelope: bytes
    match_score: float


@dataclass(frozen=True, slots=True)
class RestoredAttempt:
    """An assignment still running when the requester stopped: its result stays welcome."""

    peer: str
    attempt: int
    due_in_ms: int
    match_score: float
    model: str
    agent: str = ""


@dataclass(frozen=True, slots=True)
class RestoreTask:
    """Resume a task stored before a restart (fails it cleanly when no time is left)."""

    spec: TaskSpec
    allow_self: bool
    remaining_ms: int
    round: int
    next_attempt: int
    tried: tuple[str, ...] = ()
    kept: tuple[KeptResult, ...] = ()
    assigned: tuple[RestoredAttempt, ...] = ()
    #: SubmitTask.deferred, kept across the restart: a plan's planner or step still leaves
    #: its attestations and rewards to the larger task's vote
    deferred: bool = False


@dataclass(frozen=True, slots=True)
class CancelTask:
    task_id: bytes


@dataclass(frozen=True, slots=True)
class Reward:
    task_id: bytes
    peer: str
    reward: float


@dataclass(frozen=True, slots=True)
class TaskUpdated:
    snapshot: TaskSnapshot


@dataclass(frozen=True, slots=True)
class Attest:
    subject: str
    task_id: bytes
    kind: str
    outcome: str
    detail: str = ""


# ------------------------------------------------------------------ executor


@dataclass(frozen=True, slots=True)
class StartCompute:
    task: TaskSpec
    attempt: int
    model: str
    deadline_at_ms: int
    #: the agent the assignment names ("" = none: today's solver)
    agent: str = ""
    #: the assignment asks for the text as it is generated (AssignBody.stream)
    stream: bool = True


@dataclass(frozen=True, slots=True)
class CancelCompute:
    task_id: bytes
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeDone:
    """A finished computation of one attempt at a task: what a solver returns (models/solver.py
    and any other) and the driver hands to the executor as it is. Built by keyword only: a
    dozen fields of like types, appended to over time, are not to be read by position."""

    task_id: bytes
    attempt: int
    answer: str
    cot: str
    confidence: float
    tokens: int
    compute_ms: int
    #: content hash of the weights file that produced it
    model_hash: bytes
    fingerprints: tuple[bytes, ...] = ()
    fingerprint_root: bytes = b""
    #: the generated token ids (commit/reveal binds them; verifiers re-run them)
    output_ids: tuple[int, ...] = ()
    #: Merkle root of the per-layer hidden states the node keeps for verifiers, and their
    #: layer count (models.layer_states; empty / 0 when it keeps none)
    states_root: bytes = b""
    state_layers: int = 0
    #: tokens of the prompt the model read, and why generation ended ("stop" or "length")
    prompt_tokens: int = 0
    finish_reason: str = "stop"
    #: the agent's tool calls and its system prompt as used (protocol.agents.wire)
    tool_calls: tuple[ToolCallRecord, ...] = ()
    system_prompt: str = ""
    #: the content hash of the LoRA adapter it ran on (b"": the base model)
    adapter: bytes = b""


@dataclass(frozen=True, slots=True)
class ComputeFailed:
    task_id: bytes
    attempt: int
    reason: str
