"""`symphony bench simulate`: the swarm simulator's speed on a big ledger + task workload.

Full: 10,000 nodes running the real ledger machine (16 of them executors, 4 requesters with
real auctions) for 60 virtual minutes, tasks at 1/min with k = 3. ``--quick``: 2,000 nodes for
10 virtual minutes. ``--nodes N``: N nodes instead (the same minutes). Figures: ``nodes``, ``wall_s``, ``events_per_s``, ``peak_rss_mb`` (peak
resident memory of the process), ``virtual_s_per_wall_s`` and what the run did. The machine is
shared and noisy: ``cpu_s`` is the process's own CPU time, less sensitive to other load.
"""

from __future__ import annotations

from typing import Any

from simulations.workloads.bench import run_bench


def run(quick: bool, nodes: int | None = None) -> dict[str, Any]:
    if quick:
        return run_bench(nodes=nodes or 2_000, minutes=10.0)
    return run_bench(nodes=nodes or 10_000, minutes=60.0)
