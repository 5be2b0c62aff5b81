"""The requester's record of one task, its attempts and results, and its storable snapshot.

Used by protocol.market.auction. ``TaskPhase`` and ``AttemptState`` list their legal transitions in
``PHASE_TRANSITIONS`` and ``ATTEMPT_TRANSITIONS``; ``move_phase`` / ``move_attempt`` enforce
them (a violation is our own bug: ``LocalProtocolError``).

``TaskSnapshot`` is what the driver stores and shows: plain str/int/float/bool/list/dict data
(``to_dict``) so it can go into SQLite as JSON and out over the HTTP API unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from crypto.envelope import Envelope
from protocol.agents.wire import arguments_object
from protocol.errors import LocalProtocolError
from protocol.market.messages import BidBody, ResultBody, TaskSpec
from protocol.market.voting import VoteOutcome


class TaskPhase(enum.Enum):
    BIDDING = "bidding"  # a bid window is open (earlier attempts may still run)
    RUNNING = "running"  # no window open; waiting for assigned executors
    DONE = "done"  # voted (possibly on partial results)
    FAILED = "failed"  # no usable result by the deadline, or cancelled


PHASE_TRANSITIONS: dict[TaskPhase, frozenset[TaskPhase]] = {
    TaskPhase.BIDDING: frozenset(
        {TaskPhase.BIDDING, TaskPhase.RUNNING, TaskPhase.DONE, TaskPhase.FAILED}
    ),
    TaskPhase.RUNNING: frozenset({TaskPhase.BIDDING, TaskPhase.DONE, TaskPhase.FAILED}),
    TaskPhase.DONE: frozenset(),
    TaskPhase.FAILED: frozenset(),
}


class AttemptState(enum.Enum):
    ASSIGNED = "assigned"
    ANSWERED = "answered"
    FAILED = "failed"  # timed out, unreachable, refused, malformed
    CANCELLED = "cancelled"  # the task ended before it answered


ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    AttemptState.ASSIGNED: frozenset(
        {AttemptState.ANSWERED, AttemptState.FAILED, AttemptState.CANCELLED}
    ),
    AttemptState.ANSWERED: frozenset(),
    AttemptState.FAILED: frozenset(),
    AttemptState.CANCELLED: frozenset(),
}


@dataclass(slots=True)
class BidInfo:
    body: BidBody
    received_at_ms: int
    #: the bidder holds its slot until then
    hold_until_ms: int
    #: the match as the requester computed it (from the bidder's agent card for a task that
    #: names a need; the bid's model match otherwise), never the bidder's claim alone
    match: float


@dataclass(slots=True)
class Attempt:
    attempt: int
    peer: str
    bid: BidInfo
    state: AttemptState
    assigned_at_ms: int
    due_at_ms: int
    reason: str = ""


@dataclass(slots=True)
class ResultInfo:
    body: ResultBody
    envelope: Envelope
    attempt: int
    match_score: float
    received_at_ms: int


@dataclass(slots=True)
class OpenTask:
    spec: TaskSpec
    allow_self: bool
    phase: TaskPhase
    created_at_ms: int
    deadline_at_ms: int
    round: int = 0
    window_closes_at_ms: int = 0
    #: rounds that brought bids; bidless (or skipped) rounds in a row; when the last round
    #: closed or was skipped; when the next round is due (None: none waiting), see rounds.py
    rounds_with_bids: int = 0
    empty_rounds: int = 0
    last_round_at_ms: int = 0
    next_round_at_ms: int | None = None
    next_attempt: int = 0
    bids: dict[str, BidInfo] = field(default_factory=dict)
    spares: dict[str, BidInfo] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)
    attempts: dict[int, Attempt] = field(default_factory=dict)
    results: dict[str, ResultInfo] = field(default_factory=dict)
    outcome: VoteOutcome | None = None
    partial: bool = False
    failure: str = ""
    first_assigned_at_ms: int | None = None
    finished_at_ms: int | None = None
    forget_at_ms: int = 0
    #: SubmitTask.deferred: the vote neither attests nor rewards (a larger task's vote does)
    deferred: bool = False
    #: SubmitTask.stream: its assignments ask for a k=1 task's text as it is generated
    stream: bool = True

    @property
    def active(self) -> list[Attempt]:
        return [a for a in self.attempts.values() if a.state is AttemptState.ASSIGNED]

    @property
    def needed(self) -> int:
        return max(0, self.spec.k - len(self.results) - len(self.active))

    @property
    def finished(self) -> bool:
        return self.phase in (TaskPhase.DONE, TaskPhase.FAILED)


def move_phase(task: OpenTask, to: TaskPhase) -> None:
    if to not in PHASE_TRANSITIONS[task.phase]:
        raise LocalProtocolError(f"task {task.spec.task_id.hex()[:8]}: {task.phase} -> {to}")
    task.phase = to


def move_attempt(attempt: Attempt, to: AttemptState, reason: str = "") -> None:
    if to not in ATTEMPT_TRANSITIONS[attempt.state]:
        raise LocalProtocolError(f"attempt {attempt.attempt}: {attempt.state} -> {to}")
    attempt.state = to
    attempt.reason = reason


@dataclass(frozen=True, slots=True)
class TaskSnapshot:
    """Everything about one task a person or the database needs, as plain data."""

    data: dict[str, object]

    @property
    def task_id(self) -> str:
        return str(self.data["task_id"])

    @property
    def phase(self) -> str:
        return str(self.data["phase"])

    def to_dict(self) -> dict[str, object]:
        return dict(self.data)


def _tool_calls(body: ResultBody) -> list[dict[str, object]]:
    """A result's tool calls as plain data (arguments as the JSON object they encode)."""
    return [{"name": c.name, "arguments": arguments_object(c), "output": c.output}
            for c in body.tool_calls]


def _answered_by(task: OpenTask) -> dict[str, object]:
    """Who gave the voted answer: the executor of the heaviest ballot for the winner (ties by
    peer id), its agent and its tool calls (all None before the vote, or with no winner)."""
    outcome = task.outcome
    best = None
    if outcome is not None and outcome.winner is not None:
        best = min((s for s in outcome.ballots if s.normalized == outcome.winner),
                   key=lambda s: (-s.weight, s.ballot.executor), default=None)
    result = task.results.get(best.ballot.executor) if best is not None else None
    if result is None:
        return {"executor": None, "agent": None, "tool_calls": None}
    return {"executor": result.body.executor, "agent": result.body.agent,
            "tool_calls": _tool_calls(result.body)}


def _result_rows(task: OpenTask) -> list[dict[str, object]]:
    """One row per result received, by executor, with its vote weight once the task is decided."""
    outcome = task.outcome
    weights = {}
    normalized = {}
    if outcome is not None:
        for s in outcome.ballots:
            weights[s.ballot.executor] = s.weight
            normalized[s.ballot.executor] = s.normalized
    return [
        {
            "executor": peer,
            "attempt": r.attempt,
            "answer": r.body.answer,
            "normalized": normalized.get(peer),
            "weight": weights.get(peer),
            "confidence": r.body.confidence,
            "match_score": r.match_score,
            "agent": r.body.agent,
            "tool_calls": _tool_calls(r.body),
            "tokens": r.body.tokens,
            "prompt_tokens": r.body.prompt_tokens,
            "finish_reason": r.body.finish_reason,
            "compute_ms": r.body.compute_ms,
            "model_hash": r.body.model_hash.hex(),
            "fingerprint_root": r.body.fingerprint_root.hex(),
            "cot": r.body.cot,
            "received_at_ms": r.received_at_ms,
            "envelope": r.envelope.encode().hex(),
        }
        for peer, r in sorted(task.results.items())
    ]


def _vote_rows(task: OpenTask) -> list[dict[str, object]]:
    """The decided vote's tally, one row per distinct answer (none before the decision)."""
    outcome = task.outcome
    return [
        {"answer": row.answer, "weight": row.weight, "count": row.count,
         "share": row.share, "voters": list(row.voters)}
        for row in (outcome.rows if outcome is not None else ())
    ]


def _attempt_rows(task: OpenTask) -> list[dict[str, object]]:
    """Every attempt in the order it was made, with the bid it was assigned on."""
    return [
        {"attempt": a.attempt, "peer": a.peer, "state": a.state.value, "reason": a.reason,
         "assigned_at_ms": a.assigned_at_ms, "due_at_ms": a.due_at_ms,
         "model": a.bid.body.model, "agent": a.bid.body.agent, "match_score": a.bid.match,
         "price": a.bid.body.price, "est_latency_ms": a.bid.body.est_latency_ms}
        for a in sorted(task.attempts.values(), key=lambda a: a.attempt)
    ]


def snapshot(task: OpenTask) -> TaskSnapshot:
    spec = task.spec
    outcome = task.outcome
    data: dict[str, object] = {
        "task_id": spec.task_id.hex(),
        "phase": task.phase.value,
        "question": spec.question,
        "answer_type": spec.answer_type,
        "choices": list(spec.choices),
        "model": spec.requirement.model,
        "family": spec.requirement.family,
        "min_context": spec.requirement.min_context,
        "needs": spec.requirement.needs,
        "skills": list(spec.requirement.skills),
        "requested_agent": spec.requirement.agent,
        "need_embedding": spec.requirement.need_embedding.hex(),
        "need_scale": spec.requirement.need_scale,
        "embedder_hash": spec.requirement.embedder_hash.hex(),
        "k": spec.k,
        "max_price": spec.max_price,
        "max_tokens": spec.max_tokens,
        "style": spec.style,
        "history": [{"role": t.role, "content": t.content} for t in spec.history],
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "seed": spec.seed,
        "stop": list(spec.stop),
        "allow_self": task.allow_self,
        "deferred": task.deferred,
        "round": task.round,
        "next_attempt": task.next_attempt,
        "tried": sorted(task.tried),
        "created_at_ms": task.created_at_ms,
        "deadline_at_ms": task.deadline_at_ms,
        "first_assigned_at_ms": task.first_assigned_at_ms,
        "finished_at_ms": task.finished_at_ms,
        "answer": outcome.winner if outcome is not None else None,
        **_answered_by(task),
        "partial": task.partial,
        "failure": task.failure,
        "votes": _vote_rows(task),
        "results": _result_rows(task),
        "attempts": _attempt_rows(task),
    }
    return TaskSnapshot(data)
