"""An executor's jobs: one per task it bid on, with its states and their legal transitions.

Contract
--------
A ``Job`` is RESERVED by a bid (holding a slot until the reservation expires), RUNNING once
the assignment is accepted, or QUEUED when every compute slot is taken (it starts, earliest
deadline first, when one frees: ``startable``), and ends DONE, FAILED or RELEASED;
``TRANSITIONS`` is the whole table and ``move_job`` enforces it (any other move is our own
bug: ``LocalProtocolError``).
Every move records the state left in ``history`` and sets the job's next deadline
(``until_ms``). protocol/market/executor.py decides when each move happens.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from protocol.errors import LocalProtocolError
from protocol.market.messages import TaskSpec


class JobState(enum.Enum):
    RESERVED = "reserved"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"


TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.RESERVED: frozenset({JobState.RUNNING, JobState.QUEUED, JobState.RELEASED}),
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.RELEASED}),
    JobState.RUNNING: frozenset({JobState.DONE, JobState.FAILED, JobState.RELEASED}),
    JobState.DONE: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.RELEASED: frozenset(),
}
#: the states in which a job holds one of the executor's slots or queue places
BUSY_STATES = (JobState.RESERVED, JobState.QUEUED, JobState.RUNNING)


@dataclass(slots=True)
class Job:
    task_id: bytes
    requester: str
    round: int
    model: str
    state: JobState
    #: reservation expiry while RESERVED, result deadline while RUNNING, forget-at when final
    until_ms: int
    attempt: int = -1
    #: the assignment's result deadline (while RUNNING, until_ms adds OVERRUN_GRACE_MS)
    deadline_at_ms: int = 0
    task: TaskSpec | None = None
    #: the agent the bid named ("" = none)
    agent: str = ""
    #: the assignment asks for a k=1 task's text as it is generated (AssignBody.stream)
    stream: bool = True
    history: list[JobState] = field(default_factory=list)


def move_job(job: Job, to: JobState, until_ms: int) -> None:
    """Move ``job`` to ``to`` (along ``TRANSITIONS``), with ``until_ms`` its next deadline."""
    if to not in TRANSITIONS[job.state]:
        raise LocalProtocolError(f"job {job.task_id.hex()[:8]}: {job.state} -> {to}")
    job.history.append(job.state)
    job.state = to
    job.until_ms = until_ms


def startable(jobs: dict[bytes, Job], slots: int) -> list[Job]:
    """The queued jobs that may start now: as many as ``slots`` leaves free beside the running
    ones, earliest deadline first (the caller moves them to RUNNING)."""
    free = slots - sum(1 for j in jobs.values() if j.state is JobState.RUNNING)
    queued = sorted((j for j in jobs.values() if j.state is JobState.QUEUED),
                    key=lambda j: (j.deadline_at_ms, j.task_id))
    return queued[:max(0, free)]
