"""The capacity rule: how big a swarm an asynchronous learner needs so that it never waits.

With ``N`` workers each producing ``r`` rollouts per second, a learner that uses ``B`` rollouts
per step and takes ``T`` seconds per step never waits for data when

* supply covers demand: ``N * r >= B / T``; and
* the staleness bound covers the pipeline: ``S >= ceil((dissemination + generation) / T)``,
  where *dissemination* is the time a new policy version takes to reach the workers (the
  relay plan's transfer time) and *generation* the time a worker takes for one job. A rollout
  started on version ``v`` as soon as ``v`` arrives is returned that many steps later; with a
  smaller ``S`` it is stale on arrival, and the learner idles or drops it.

:func:`plan` evaluates both inequalities and the figures around them (``symphony rl plan``
prints them; the simulator reproduces them). All times are seconds here, as the rule is stated;
bad input raises ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CapacityInputs:
    """A learner and its rollout workers, as the capacity rule sees them."""

    workers: int
    #: rollouts per second one worker produces
    rollouts_per_s: float
    #: rollouts the learner consumes per step (B)
    batch: int
    #: seconds per learner step (T)
    step_s: float
    #: seconds for a new policy version to reach the workers
    dissemination_s: float
    #: seconds one job (a group of completions) takes on a worker
    generation_s: float
    #: the staleness bound the learner runs with (S)
    staleness: int = 0


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    supply_per_s: float  # N * r
    demand_per_s: float  # B / T
    throughput_ok: bool  # N * r >= B / T
    #: the fewest workers at this r for which supply covers demand
    min_workers: int
    #: ceil((dissemination + generation) / T)
    min_staleness: int
    staleness_ok: bool  # S >= min_staleness
    #: the learner's busy fraction if nothing else limits it: min(1, N r T / B)
    busy_bound: float

    @property
    def holds(self) -> bool:
        return self.throughput_ok and self.staleness_ok


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def check_inputs(inputs: CapacityInputs) -> None:
    """``ValueError`` naming the first field of ``inputs`` outside its domain."""
    if type(inputs.workers) is not int or inputs.workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {inputs.workers!r}")
    if type(inputs.batch) is not int or inputs.batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {inputs.batch!r}")
    if type(inputs.staleness) is not int or inputs.staleness < 0:
        raise ValueError(f"staleness must be an int >= 0, got {inputs.staleness!r}")
    _positive("rollouts_per_s", inputs.rollouts_per_s)
    _positive("step_s", inputs.step_s)
    _non_negative("dissemination_s", inputs.dissemination_s)
    _non_negative("generation_s", inputs.generation_s)


def min_staleness(dissemination_s: float, generation_s: float, step_s: float) -> int:
    """``ceil((dissemination + generation) / T)``, robust to float noise at exact multiples."""
    _non_negative("dissemination_s", dissemination_s)
    _non_negative("generation_s", generation_s)
    _positive("step_s", step_s)
    return max(0, math.ceil((dissemination_s + generation_s) / step_s - 1e-9))


def plan(inputs: CapacityInputs) -> CapacityPlan:
    """Both inequalities of the capacity rule for ``inputs``, with the figures around them."""
    check_inputs(inputs)
    supply = inputs.workers * inputs.rollouts_per_s
    demand = inputs.batch / inputs.step_s
    need_s = min_staleness(inputs.dissemination_s, inputs.generation_s, inputs.step_s)
    return CapacityPlan(
        supply_per_s=supply,
        demand_per_s=demand,
        throughput_ok=supply >= demand * (1 - 1e-9),
        min_workers=math.ceil(demand / inputs.rollouts_per_s - 1e-9),
        min_staleness=need_s,
        staleness_ok=inputs.staleness >= need_s,
        busy_bound=min(1.0, supply / demand),
    )


def rollouts_in_flight(batch: int, staleness: int, turnaround_s: float, step_s: float) -> int:
    """How many rollouts an asynchronous learner keeps issued or waiting, so that it never
    waits and none goes stale in its queue: ``(min(S, ceil(turnaround / T)) + 1) B``, from
    the measured time a job takes to come back (``turnaround``) and the step time ``T``.
    With S = 0 that is one batch: the synchronous learner issues the next batch only when it
    has the current one."""
    if type(batch) is not int or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    if type(staleness) is not int or staleness < 0:
        raise ValueError(f"staleness must be an int >= 0, got {staleness!r}")
    _non_negative("turnaround_s", turnaround_s)
    _positive("step_s", step_s)
    return (min(staleness, math.ceil(turnaround_s / step_s - 1e-9)) + 1) * batch


#: jobs a worker holds before its learner has measured a step and a job: the one it generates
#: and the next, queued behind it
DEFAULT_JOBS_PER_WORKER = 2


def jobs_per_worker(step_s: float | None, generation_s: float | None) -> int:
    """How many jobs a worker should hold at once (the one it generates and those queued
    behind it) when its learner hands out jobs only between its steps: during a step of ``T``
    seconds a worker taking ``g`` seconds per job finishes up to ``ceil(T / g)`` of them, and
    needs one more in hand so as not to idle until the step ends: ``ceil(T / g) + 1``, at least
    2. None for a time not measured yet gives ``DEFAULT_JOBS_PER_WORKER``. The learner's bound
    on jobs issued or waiting still caps all workers' jobs together, so a queued job is no
    staler than one issued when its worker comes free."""
    if step_s is None or generation_s is None:
        return DEFAULT_JOBS_PER_WORKER
    _non_negative("step_s", step_s)
    _positive("generation_s", generation_s)
    return max(DEFAULT_JOBS_PER_WORKER, math.ceil(step_s / generation_s - 1e-9) + 1)
