"""The simulator's benchmark workload: a large ledger swarm with a task market on top.

``run_bench(nodes, minutes)`` builds ``nodes`` virtual nodes that all run the real ledger
machine (light nodes replicate every record and attestation), of which ``executors`` also
advertise a capability and run the real executor, and ``requesters`` run the real auction.
Executors and requesters also connect to a few executors (the market's core, as peer exchange
would find them), so beacons reach bidders. Tasks arrive at ``tasks_per_min`` with k = 3;
every finished task floods k signed attestations to all nodes. Returns wall-clock and CPU
seconds, events run, events per second and the peak resident memory of the process, beside
what the run did (tasks ended, broadcasts, deliveries).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import Any

from protocol.ledger.machine import LedgerConfig
from protocol.market.events import AuctionConfig, SubmitTask
from protocol.market.executor import ExecutorConfig, ServedModel
from protocol.market.selection import ScoreSelector
from simulations.compute.cost import (
    ANSWER_TYPE,
    DEVICES,
    CostModel,
    ExecutorProfile,
    Question,
    model_hash,
    question_bank,
)
from simulations.engine import fewer_gc_passes
from simulations.machines.ledger import ledger_spec
from simulations.machines.market import AUCTION, auction_spec, executor_spec
from simulations.network import LatencyModel
from simulations.swarm import Swarm, derive_rng
from simulations.workloads.common import MODEL_FAMILY, MODEL_NAME, capability

#: the bench's ledger: anti-entropy every 10 min, records re-signed every 20 min
BENCH_LEDGER = LedgerConfig(
    anti_entropy_ms=600_000, refresh_ms=20 * 60_000, record_ttl_ms=60 * 60_000
)
DEGREE = 8
CORE_LINKS = 4


def run_bench(
    nodes: int = 10_000,
    minutes: float = 60.0,
    *,
    seed: int = 1,
    executors: int = 16,
    requesters: int = 4,
    tasks_per_min: float = 1.0,
    on_progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    return bench_swarm(
        nodes,
        minutes,
        seed=seed,
        executors=executors,
        requesters=requesters,
        tasks_per_min=tasks_per_min,
        on_progress=on_progress,
    )[0]


def bench_swarm(
    nodes: int,
    minutes: float,
    *,
    seed: int = 1,
    executors: int = 16,
    requesters: int = 4,
    tasks_per_min: float = 1.0,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], Swarm]:
    """``run_bench``'s report and the swarm it ran (for tests that look inside);
    ``on_progress(now_us)`` is called as the run goes (every 50,000 events)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    rng = derive_rng(seed, "bench")
    bank = question_bank(rng, 500, ("math", "code"))
    n_exec = min(executors, nodes // 2)
    n_req = min(requesters, nodes - n_exec)
    done: list[int] = []
    end_ms = int(minutes * 60_000)
    with fewer_gc_passes():
        swarm = _bench_world(seed, nodes, n_exec, n_req, CostModel(bank))
        swarm.on_emit("task.done", lambda node, f, now: done.append(now))
        swarm.on_emit("task.failed", lambda node, f, now: done.append(now))
        submitted = _schedule_tasks(swarm, rng, bank, n_exec, n_req, tasks_per_min, end_ms)
        setup_s = time.perf_counter() - wall0
        events = swarm.run(end_ms, on_progress)
    wall_s = time.perf_counter() - wall0
    cpu_s = time.process_time() - cpu0
    counters = swarm.metrics.counters
    report = {
        "nodes": nodes,
        "virtual_minutes": minutes,
        "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3),
        "setup_s": round(setup_s, 3),
        "events": events,
        "events_per_s": round(events / max(1e-9, wall_s - setup_s), 1),
        "virtual_s_per_wall_s": round(minutes * 60 / wall_s, 2),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "tasks_submitted": submitted,
        "tasks_ended": len(done),
        "gossip_broadcasts": counters.get("gossip_published", 0),
        "machine_deliveries": sum(n.msgs_received for n in swarm.nodes),
        "bytes_per_node": round(sum(swarm.bytes_per_node()) / nodes),
    }
    return report, swarm


def _bench_world(seed: int, nodes: int, n_exec: int, n_req: int, cost: CostModel) -> Swarm:
    """Every node a ledger; the first ``n_exec`` executors, the next ``n_req`` requesters;
    a random topology of ``DEGREE`` plus ``CORE_LINKS`` from each of those into the
    executors."""
    device = DEVICES["rtx3090"]

    def exec_config(node: Any) -> ExecutorConfig:
        served = ServedModel(
            MODEL_NAME,
            MODEL_FAMILY,
            8192,
            model_hash(MODEL_NAME),
            device.tokens_per_s,
            device.price_per_1k,
        )
        return ExecutorConfig(models=(served,), slots=4)

    led = ledger_spec(
        "sim",
        BENCH_LEDGER,
        lambda node: capability(node, device, slots=4) if node.index < n_exec else None,
    )
    exe = executor_spec(exec_config, cost)
    auc = auction_spec(lambda node: ScoreSelector(), AuctionConfig())
    swarm = Swarm(seed, latency=LatencyModel("lognormal", 40.0, 0.5, jitter_ms=5.0))
    for i in range(nodes):
        specs = (led, exe) if i < n_exec else ((led, auc) if i < n_exec + n_req else (led,))
        swarm.add_node(specs, profile=ExecutorProfile(device=device) if i < n_exec else None)
    for node in swarm.nodes:
        swarm.start(node)
    topo = derive_rng(seed, "bench-topology")
    for node in swarm.nodes:
        swarm.connect_random(node, DEGREE // 2, topo)
    core = swarm.nodes[:n_exec]
    for node in swarm.nodes[: n_exec + n_req]:
        for _ in range(CORE_LINKS):
            swarm.connect(node, core[topo.randrange(len(core))])
    return swarm


def _schedule_tasks(
    swarm: Swarm,
    rng: Any,
    bank: list[Question],
    n_exec: int,
    n_req: int,
    tasks_per_min: float,
    end_ms: int,
) -> int:
    """A Poisson stream of k=3 tasks from random requesters until a minute before the end;
    returns how many."""
    t = 0.0
    submitted = 0
    while True:
        t += rng.expovariate(tasks_per_min / 60_000.0)
        if t >= end_ms - 60_000:
            return submitted
        q = bank[rng.randrange(len(bank))]
        node = swarm.nodes[n_exec + rng.randrange(n_req)]
        swarm.at_ms(
            int(t),
            node.submit,
            AUCTION,
            SubmitTask(
                question=q.text,
                answer_type=ANSWER_TYPE,
                deadline_ms=60_000,
                k=3,
                model=MODEL_NAME,
            ),
        )
        submitted += 1
