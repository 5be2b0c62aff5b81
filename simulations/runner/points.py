"""Where a sweep's points run: one after another in this process, or on a Dask cluster.

Contract
--------
* A sweep point is a call ``fn(*args)`` of a module-level function whose arguments and result
  pickle (a scenario, numbers, dicts): it builds its own swarm from the scenario's seed, so
  its figures depend on its arguments alone, never on where or beside what it runs. ``fn``
  also takes ``progress=`` (its own fraction done, a label), which only a local run passes.
* ``runner.map(Sweep(fn, points, weights, label))`` returns the results in the order of ``points``.
  ``LocalPoints`` runs them here, in order, reporting each one's progress as it goes;
  ``DaskPoints(address)`` submits them all to the Dask scheduler at ``tcp://HOST:PORT``
  (``distributed.Client``) and gathers them in order: a study that outgrows one machine
  runs on an existing cluster engine. The workers must import this package (same version).
* Each point runs with the collector paused (``fewer_gc_passes``), here or on a worker, and
  its swarm is collected as soon as it ends.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from simulations.engine import fewer_gc_passes
from simulations.scenario import ScenarioError
from simulations.workloads.common import Progress, no_progress

#: seconds to wait for the scheduler to answer before giving up
CONNECT_TIMEOUT_S = 10


def run_point(
    fn: Callable[..., Any], args: tuple[Any, ...], progress: Progress | None = None
) -> Any:
    """One point, here or on a worker (there without progress)."""
    with fewer_gc_passes():
        result = fn(*args) if progress is None else fn(*args, progress=progress)
    # a point's swarm is a web of reference cycles (nodes and the swarm hold each other):
    # freed now, not after the whole sweep (the collector may be paused around it)
    gc.collect()
    return result


@dataclass(frozen=True)
class Sweep:
    """A sweep's points: ``fn(*args)`` for each ``args`` of ``points``, each ``weights``-heavy
    in the progress shown under ``label``."""

    fn: Callable[..., Any]
    points: Sequence[tuple[Any, ...]]
    weights: Sequence[float]
    label: str

    def fraction(self, done: float) -> float:
        """The sweep's fraction done once points of total weight ``done`` are."""
        return min(1.0, done / (sum(self.weights) or 1.0))


class SweepPoints(Protocol):
    def map(self, sweep: Sweep) -> list[Any]: ...


class LocalPoints:
    """Every point in this process, one after another."""

    def __init__(self, progress: Progress = no_progress) -> None:
        self.progress = progress

    def map(self, sweep: Sweep) -> list[Any]:
        done = 0.0
        results = []
        for args, weight in zip(sweep.points, sweep.weights, strict=True):

            def part(fraction: float, what: str, done: float = done, weight: float = weight) -> None:
                self.progress(sweep.fraction(done + weight * fraction), what)

            results.append(run_point(sweep.fn, args, part))
            done += weight
        return results


class DaskPoints:
    """Every point a task on the Dask cluster whose scheduler listens at ``address``."""

    def __init__(
        self,
        address: str,
        progress: Progress = no_progress,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        if not address.startswith("tcp://"):
            raise ScenarioError(f"scheduler address {address!r}: expected tcp://HOST:PORT")
        self.address = address
        self.progress = progress
        self.connect_timeout_s = connect_timeout_s

    def map(self, sweep: Sweep) -> list[Any]:
        from distributed import Client

        try:
            client = Client(self.address, set_as_default=False, timeout=self.connect_timeout_s)
        except OSError as exc:
            raise ScenarioError(f"no Dask scheduler at {self.address}: {exc}") from None
        with client:
            # pure=False: two points with equal arguments are still two runs (none here)
            futures = [client.submit(run_point, sweep.fn, args, pure=False)
                       for args in sweep.points]
            results = []
            done = 0.0
            for future, weight in zip(futures, sweep.weights, strict=True):  # all run meanwhile
                results.append(future.result())
                done += weight
                self.progress(sweep.fraction(done), sweep.label)
            return results
