"""Run a scenario: pick its workload, time it, report.

``run_scenario(scenario, progress, scheduler) -> (Report, wall_s)``; ``write`` puts report.json
and report.html in a directory. The CLI (node/cli/simulate.py) and the tests call these.
With ``scheduler`` (``tcp://HOST:PORT``), the sweep's points run on that Dask cluster
(simulations/runner/points.py): only the workloads in ``CLUSTER_SWEEP_KINDS`` hand theirs out.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from simulations.engine import fewer_gc_passes
from simulations.runner.points import DaskPoints
from simulations.runner.report import Report, write
from simulations.scenario import Scenario, ScenarioError
from simulations.workloads import WORKLOADS
from simulations.workloads.common import Progress, no_progress

#: the workloads that can run the real model (simulations/compute/models_backend.py); routing scores
#: its choices by the profiles' skill, which a real model does not have
REAL_COMPUTE_KINDS = frozenset({"voting"})
#: the workloads whose ``run`` takes ``points`` (simulations/runner/points.py)
CLUSTER_SWEEP_KINDS = frozenset({"ledger"})


def run_scenario(
    scenario: Scenario, progress: Progress = no_progress, scheduler: str | None = None
) -> tuple[Report, float]:
    module_name = WORKLOADS.get(scenario.kind)
    if module_name is None:
        raise ScenarioError(
            f"{scenario.name}: unknown kind {scenario.kind!r} (known: {', '.join(sorted(WORKLOADS))})"
        )
    if scenario.compute.real and scenario.kind not in REAL_COMPUTE_KINDS:
        raise ScenarioError(
            f"{scenario.name} [compute] backend: 'models' serves only "
            f"{', '.join(sorted(REAL_COMPUTE_KINDS))}, not {scenario.kind!r}"
        )
    if scheduler is not None and scenario.kind not in CLUSTER_SWEEP_KINDS:
        raise ScenarioError(
            f"{scenario.name}: --scheduler runs the sweeps of "
            f"{', '.join(sorted(CLUSTER_SWEEP_KINDS))} only, not {scenario.kind!r}"
        )
    module = importlib.import_module(module_name)
    started = time.perf_counter()
    with fewer_gc_passes():
        if scheduler is None:
            report: Report = module.run(scenario, progress)
        else:
            report = module.run(scenario, progress, DaskPoints(scheduler, progress))
    return report, time.perf_counter() - started


def run_and_write(
    scenario: Scenario,
    out_dir: Path,
    progress: Progress = no_progress,
    scheduler: str | None = None,
) -> tuple[Report, float, Path, Path]:
    report, wall_s = run_scenario(scenario, progress, scheduler)
    json_path, html_path = write(report, out_dir, wall_s=wall_s)
    return report, wall_s, json_path, html_path
