"""What the RL machines and their drivers tell each other: commands in, effects out.

The learner's side (protocol/rl/auction.py ``RolloutAuction``): ``IssueJobs``,
``PublishVersion`` and ``Convict`` come from the learner's driver; ``GroupAccepted`` goes to it.
The worker's side (protocol/rl/worker.py ``RolloutWorker``): ``StartRollout`` and
``CancelRollout`` tell the driver to generate or stop, ``RolloutDone`` and ``RolloutFailed``
bring the outcome back, ``LearnerSeen`` reports a learner's first genuine beacon.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.rl.messages import RolloutJob, RolloutResultBody

# ---------------------------------------------------------------- the learner's side


@dataclass(frozen=True, slots=True)
class IssueJobs:
    count: int
    #: None: the version being trained
    version: int | None = None


@dataclass(frozen=True, slots=True)
class PublishVersion:
    version: int


@dataclass(frozen=True, slots=True)
class Convict:
    """A later check (the learner's recomputation) failed for an accepted group."""

    job_id: bytes
    reason: str


@dataclass(frozen=True, slots=True)
class GroupAccepted:
    """A validated, fresh group for the learner to score and train on."""

    result: RolloutResultBody


# ---------------------------------------------------------------- the worker's side


@dataclass(frozen=True, slots=True)
class LearnerSeen:
    """Effect: the first genuine beacon of ``learner`` for this worker's model arrived."""

    learner: str


@dataclass(frozen=True, slots=True)
class StartRollout:
    job: RolloutJob
    attempt: int
    deadline_at_ms: int


@dataclass(frozen=True, slots=True)
class CancelRollout:
    job_id: bytes
    attempt: int


@dataclass(frozen=True, slots=True)
class RolloutDone:
    """The driver's generation finished; ``result``'s worker and attempt are set here."""

    job_id: bytes
    attempt: int
    result: RolloutResultBody


@dataclass(frozen=True, slots=True)
class RolloutFailed:
    job_id: bytes
    attempt: int
    reason: str
