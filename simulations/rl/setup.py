"""The setup and figures of one simulated RL run, and the workers' dissemination times.

``RlSetup`` holds one run's parameters (simulations/workloads/rl.py fills it from a scenario),
``RlFigures`` what the run measured beside the capacity rule's prediction, and
:func:`dissemination_delays` each worker's time to hold a new policy version, from the relay
plan (protocol/relay/plan.py) of the adapter over the workers' upload bandwidths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from random import Random

from protocol.market.selection import EXPLORE_SHARE
from protocol.relay.plan import PlanInputs, build_plan
from protocol.rl.capacity import CapacityPlan
from protocol.rl.messages import RolloutJob
from simulations.engine import US_PER_S

MIB = 1 << 20


@dataclass(frozen=True)
class RlSetup:
    workers: int
    staleness: int
    batch: int = 256  # rollouts per learner step, B
    group_size: int = 8  # completions per job, G
    tokens: int = 256  # tokens per completion, L
    step_s: float = 10.0  # learner step time, T
    adapter_mib: float = 8.0  # one policy version's adapter
    chunk_mib: float = 1.0
    learner_up_bps: float = 1_000e6 / 8
    #: (share, upload bytes/s) classes of the workers' uplinks
    uploads: tuple[tuple[float, float], ...] = ((1.0, 20e6 / 8),)
    #: (device name, share) of the workers
    devices: tuple[tuple[str, float], ...] = (("cpu", 0.3), ("laptop-gpu", 0.2),
                                              ("rtx3090", 0.3), ("rtx4090", 0.15),
                                              ("a100", 0.05))
    crash_per_min: float = 0.0
    restart_after_s: float = 60.0
    cheater_share: float = 0.0
    duration_s: float = 600.0
    latency_ms: float = 40.0
    learner_cost_per_h: float = 4.0  # the learner's machine, idle or not
    worker_cost_per_h: float = 0.3  # a worker is paid for the time it generates
    #: beacon, bids and assignment before a worker starts
    assign_ms: int = 300
    deadline_factor: float = 3.0
    #: share of job picks given to workers never picked before (the daemon's default)
    explore_share: float = EXPLORE_SHARE


@dataclass(slots=True)
class SimWorker:
    peer: str
    tokens_per_s: float
    price_per_1k: float
    delay_us: int
    cheater: bool
    held: int = 0
    alive: bool = True
    epoch: int = 0
    job: RolloutJob | None = None


@dataclass
class RlFigures:
    workers: int
    staleness: int
    steps: int = 0
    busy_fraction: float = 0.0
    learner_idle_s: float = 0.0
    generated: int = 0
    stale: int = 0
    caught: int = 0
    cheaters: int = 0
    honest_excluded: int = 0
    timeouts: int = 0
    cost_per_step: float = 0.0
    dissemination_s: float = 0.0
    generation_s: float = 0.0
    rollouts_per_s: float = 0.0
    predicted: CapacityPlan | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def stale_fraction(self) -> float:
        return self.stale / self.generated if self.generated else 0.0


def pick(rng: Random, table: tuple[tuple[str, float], ...]) -> str:
    x = rng.random() * sum(w for _, w in table)
    for name, weight in table:
        x -= weight
        if x < 0:
            return name
    return table[-1][0]


def dissemination_delays(setup: RlSetup, uploads: list[float], seed: int) -> list[int]:
    """Each worker's time (us) to hold a new version after publication, from the relay plan."""
    peers = [(f"w{i:05d}", int(u)) for i, u in enumerate(uploads)]
    size, chunk = int(setup.adapter_mib * MIB), int(setup.chunk_mib * MIB)
    relay = build_plan(PlanInputs("learner", int(setup.learner_up_bps), tuple(peers),
                                  total_size=size, chunk_size=min(chunk, size),
                                  seed=seed.to_bytes(8, "big")))
    rate = relay.rate_bps
    return [int(((size + relay.depth[p] * min(chunk, size)) / rate
                 + relay.depth[p] * setup.latency_ms / 1000) * US_PER_S) for p, _ in peers]
