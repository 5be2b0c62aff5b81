"""How long an executor expects a task it bids on to take, learned from its own tasks.

A pure rule (times come in as arguments) that protocol/market/executor.py applies to every
beacon it could bid on, so the daemon's executors and the simulator's estimate alike; a bid
carries the estimate, and a beacon whose deadline it exceeds is declined as too slow.
:class:`LatencyModel` promises:

* one task costs its tokens at the model's measured speed plus the *overhead*: what finished
  tasks took beyond their tokens (prompt, commitments), an EWMA over the executor's finished
  tasks, the first one taken outright;
* the overhead loses half its weight for every ``half_life_ms`` without a new measurement.
  Only a task run corrects the estimate, and an executor that declines every beacon as too
  slow runs none: without the decay, one measurement taken while the machine was overloaded
  (or while the backend was still busy with an abandoned task) kept it silent for good;
* the wait ahead of a new task counts the accepted jobs (running or queued) as one task each,
  and the live reservations at the share of this executor's reservations that became
  assignments (an EWMA of won = 1 and lost = 0, starting at 1, so the first queue is not
  underestimated): a bid that loses its auction, or is kept as a spare and released, never
  becomes work, and counting every reservation as a whole task made a loaded executor's
  estimate several times what its queue would take, so it declined everything;
* ``estimate_ms`` is the task's cost times one plus the wait ahead per slot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from protocol.errors import LocalProtocolError
from protocol.market.jobs import Job, JobState

#: a learned overhead counts half as much after this long without a new measurement
OVERHEAD_HALF_LIFE_MS = 60_000
#: weight of a new measurement in the overhead's EWMA
OVERHEAD_GAIN = 0.3
#: weight of a reservation's outcome (won or lost) in the share of reservations won
WIN_GAIN = 0.1


@dataclass(frozen=True, slots=True)
class Ahead:
    """The executor's jobs ahead of a new task."""

    running: int
    queued: int
    reserved: int
    slots: int


def ahead_of(jobs: Iterable[Job], slots: int) -> Ahead:
    """What stands ahead of a new task among an executor's ``jobs`` (with ``slots``)."""
    states = [j.state for j in jobs]
    return Ahead(states.count(JobState.RUNNING), states.count(JobState.QUEUED),
                 states.count(JobState.RESERVED), slots)


class LatencyModel:
    def __init__(self, half_life_ms: int = OVERHEAD_HALF_LIFE_MS) -> None:
        if half_life_ms < 1:
            raise LocalProtocolError("half_life_ms must be positive")
        self.half_life_ms = half_life_ms
        #: measured cost of a task beyond its tokens (ms), and when it was last measured
        self.overhead_ms: float | None = None
        self.measured_at_ms = 0
        #: share of reservations that became assignments
        self.win_share = 1.0

    def overhead_at(self, now: int) -> float:
        """The learned overhead as it counts at ``now`` (decayed since its measurement)."""
        if self.overhead_ms is None:
            return 0.0
        age = max(0, now - self.measured_at_ms)
        return float(self.overhead_ms * 0.5 ** (age / self.half_life_ms))

    def task_done(self, tokens: int, compute_ms: int, tokens_per_s: float, now: int) -> None:
        """Learn from a finished task: ``tokens`` generated in ``compute_ms``."""
        extra = max(0.0, compute_ms - tokens / max(tokens_per_s, 1e-6) * 1000.0)
        seen = extra if self.overhead_ms is None else self.overhead_at(now)
        self.overhead_ms = seen + OVERHEAD_GAIN * (extra - seen)
        self.measured_at_ms = now

    def reservation_ended(self, won: bool) -> None:
        """A reservation became an assignment (``won``) or was released without one."""
        self.win_share += WIN_GAIN * ((1.0 if won else 0.0) - self.win_share)

    def estimate_ms(self, max_tokens: int, tokens_per_s: float, ahead: Ahead,
                    now: int) -> int:
        """Time from a bid to its result for a task of ``max_tokens`` behind ``ahead``."""
        task_ms = max_tokens / max(tokens_per_s, 1e-6) * 1000.0 + self.overhead_at(now)
        waiting = ahead.running + ahead.queued + ahead.reserved * self.win_share
        return round(task_ms * (1.0 + waiting / max(1, ahead.slots)))
