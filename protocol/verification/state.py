"""The requester's verification records: configuration, commit windows, checks in flight,
exclusions.

Used by protocol/verification/requester.py and its components (commits.py, verdicts.py).
``CheckPhase`` lists the life of one result under check with its legal transitions in
``CHECK_TRANSITIONS``; ``move_check`` enforces them (a violation is our own bug:
``LocalProtocolError``).

``status_of`` renders what a person (``symphony ask``), the database and the HTTP API see per
result: plain str/int/bool/list/dict data, merged into the task snapshot under
``"verification"`` (executor -> status) and as ``results[i]["verification"]``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from crypto.envelope import Envelope
from protocol.errors import LocalProtocolError
from protocol.market.state import ResultInfo
from protocol.verification.messages import CommitBody, Reveal

#: the defaults below, as named constants
DEFAULT_SAMPLE_RATE = 0.2
DEFAULT_VERIFIERS = 2
DEFAULT_PANEL = 3
DEFAULT_MAX_ESCALATIONS = 2
DEFAULT_CHUNKS_PER_CHECK = 2
DEFAULT_COMMIT_WINDOW_MS = 15_000
DEFAULT_REVEAL_MS = 5_000
DEFAULT_CHECK_TIMEOUT_MS = 30_000
DEFAULT_EXCLUSION_MS = 60 * 60 * 1000


@dataclass(frozen=True, slots=True)
class VerifyConfig:
    #: probability that one result is re-checked (drawn from the unsteerable seed)
    sample_rate: float = DEFAULT_SAMPLE_RATE
    #: verifiers asked first for a checked result
    verifiers: int = DEFAULT_VERIFIERS
    #: fresh verifiers per escalation round when verdicts disagree
    panel: int = DEFAULT_PANEL
    max_escalations: int = DEFAULT_MAX_ESCALATIONS
    #: fingerprint chunks re-computed per check
    chunks_per_check: int = DEFAULT_CHUNKS_PER_CHECK
    #: the window opens at a task's first commitment and closes when every running attempt
    #: has committed or after this long; attempts that missed it are replaced
    commit_window_ms: int = DEFAULT_COMMIT_WINDOW_MS
    #: time an executor has to reveal once asked
    reveal_ms: int = DEFAULT_REVEAL_MS
    #: time a verifier has to return its verdict before the next one in the ranking is asked
    check_timeout_ms: int = DEFAULT_CHECK_TIMEOUT_MS
    #: a peer whose result failed verification gets no assignment from us for this long
    exclusion_ms: int = DEFAULT_EXCLUSION_MS
    #: a result with output tokens but no fingerprints cannot be checked: refuse it
    require_fingerprints: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError("sample_rate must be in [0, 1]")
        for name in ("verifiers", "panel", "chunks_per_check", "commit_window_ms",
                     "reveal_ms", "check_timeout_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_escalations < 0 or self.exclusion_ms < 0:
            raise ValueError("max_escalations and exclusion_ms must be >= 0")


class CheckPhase(enum.Enum):
    CHECKING = "checking"
    PASSED = "passed"
    FAILED = "failed"
    UNDECIDED = "undecided"
    #: the task ended (deadline, cancel) before a decision
    ABANDONED = "abandoned"


CHECK_TRANSITIONS: dict[CheckPhase, frozenset[CheckPhase]] = {
    CheckPhase.CHECKING: frozenset({CheckPhase.PASSED, CheckPhase.FAILED, CheckPhase.UNDECIDED,
                                    CheckPhase.ABANDONED}),
    CheckPhase.PASSED: frozenset(),
    CheckPhase.FAILED: frozenset(),
    CheckPhase.UNDECIDED: frozenset(),
    CheckPhase.ABANDONED: frozenset(),
}


@dataclass(slots=True)
class Batch:
    """One commit window: the commitments whose hashes feed one seed."""

    opened_at_ms: int
    closes_at_ms: int
    attempts: list[int] = field(default_factory=list)
    closed_at_ms: int | None = None
    seed: bytes = b""


@dataclass(slots=True)
class CommitInfo:
    body: CommitBody
    envelope: Envelope
    hash: bytes
    batch: Batch
    received_at_ms: int
    reveal: Reveal | None = None


@dataclass(slots=True)
class Check:
    """One result under check: its ranking of verifiers and the verdicts per round."""

    task_id: bytes
    attempt: int
    executor: str
    result: ResultInfo
    commit: CommitInfo
    seed: bytes
    chunks: tuple[int, ...]
    evidence: bytes
    ranking: list[str]
    next_rank: int = 0
    phase: CheckPhase = CheckPhase.CHECKING
    #: rounds[r]: verifier -> passed, for the verdicts of round r
    rounds: list[dict[str, bool]] = field(default_factory=lambda: [{}])
    #: verifier -> (check id, due at) for the verdicts still awaited in the current round
    outstanding: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    #: verifier -> what became of it ("pass", "fail", "declined", "timeout", "invalid")
    outcomes: dict[str, str] = field(default_factory=dict)
    started_at_ms: int = 0


def move_check(check: Check, to: CheckPhase) -> None:
    if to not in CHECK_TRANSITIONS[check.phase]:
        raise LocalProtocolError(f"check {check.task_id.hex()[:8]}/{check.attempt}: "
                                 f"{check.phase} -> {to}")
    check.phase = to


@dataclass(slots=True)
class VerifyTask:
    """Per task: the requester's nonce, the commitments, the windows, the statuses."""

    nonce: bytes
    nonce_hash: bytes
    commits: dict[int, CommitInfo] = field(default_factory=dict)
    open_batch: Batch | None = None
    #: attempts assigned before this instant had to commit in a window that has closed
    committed_by_ms: int | None = None
    status: dict[str, dict[str, object]] = field(default_factory=dict)


class Exclusions:
    """Peers the requester picks no bids from: those it convicted itself, for
    ``exclusion_ms`` after the conviction, and those ``by_ledger`` says the ledger shows
    failing (protocol/verification/candidates.py). The auction is given ``is_excluded``."""

    def __init__(self, by_ledger: Callable[[str, int], bool], exclusion_ms: int) -> None:
        self.by_ledger = by_ledger
        self.exclusion_ms = exclusion_ms
        #: peers we convicted -> until when we exclude them
        self.convicted: dict[str, int] = {}

    def convict(self, peer: str, now: int) -> None:
        self.convicted[peer] = now + self.exclusion_ms

    def is_excluded(self, peer: str, now: int) -> bool:
        until = self.convicted.get(peer)
        return (until is not None and now < until) or self.by_ledger(peer, now)


def status_of(check: Check, now: int) -> dict[str, object]:
    outcomes = dict(check.outcomes)
    for v in check.outstanding:
        outcomes[v] = "pending"
    return {
        "status": check.phase.value, "attempt": check.attempt, "sampled": True,
        "round": len(check.rounds) - 1, "chunks": list(check.chunks),
        "verifiers": dict(sorted(outcomes.items())), "evidence_hash": check.evidence.hex(),
        "elapsed_ms": now - check.started_at_ms,
    }

