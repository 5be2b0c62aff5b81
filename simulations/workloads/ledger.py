"""Ledger: convergence time and bytes per node versus N, and versus churn.

Every node runs the real ``LedgerMachine``; ``advertisers`` of them publish capability
records (the rest are light nodes that only replicate). After ``warmup_s`` the advertisers
update their records (``SetLoad``) one after another, every ``update_interval_s``. For each
update we record when each node *stores* the new version (the moment the daemon persists it)
and report the time until 50%, 99% and 100% of the nodes that were up throughout hold it.
Bytes are everything sent and received per node during the measurement window, split into
gossip and anti-entropy (digests, sync requests and replies).

With churn (``[sweep] churn_crash_per_min``), nodes crash and restart from their store after
``restart_after_s``; *freshness* is the fraction of live nodes holding the newest record of
every advertiser, sampled every ``sample_s``: what a requester sees when it reads its ledger.

``[workload]``: ``advertisers`` (32), ``warmup_s`` (30), ``updates`` (8),
``update_interval_s`` (10), ``anti_entropy_s`` (30), ``sample_s`` (5), ``settle_s`` (60).
``[sweep]``: ``nodes`` ([100, 300, 1000, 3000, 10000]), ``churn_nodes`` (500),
``churn_crash_per_min`` ([0, 0.01, 0.05, 0.1]).
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import Any

from protocol.ledger.machine import LedgerConfig, SetLoad, StoreCapability
from simulations.compute.cost import DEVICES
from simulations.machines.ledger import NAME, ledger_of, ledger_spec
from simulations.metrics import percentile, summary
from simulations.node import VirtualNode
from simulations.runner.points import LocalPoints, Sweep, SweepPoints
from simulations.runner.report import Plot, Report, Series
from simulations.runner.world import Churn, build_swarm
from simulations.scenario import ChurnSpec, Scenario, workload_value
from simulations.swarm import Swarm, derive_rng
from simulations.workloads.common import (
    Progress,
    Stages,
    capability,
    no_progress,
    window_bytes,
)

QUESTION = (
    "How fast does a ledger update reach every node, and how many bytes does each node "
    "pay, as the network grows to 10,000 nodes and as nodes churn?"
)
NETWORK_ID = "sim"
ANTI_ENTROPY_KINDS = ("LedgerDigest", "LedgerSyncRequest", "LedgerPush")


class LedgerRun:
    """One swarm of ledger nodes with its measurements."""

    def __init__(self, scenario: Scenario, nodes: int, seed: int, churn: ChurnSpec) -> None:
        self.scenario = scenario
        self.n = nodes
        self.advertisers = min(nodes, int(workload_value(scenario, "advertisers", 32)))
        config = LedgerConfig(
            anti_entropy_ms=int(workload_value(scenario, "anti_entropy_s", 30.0) * 1000)
        )
        #: (peer, seq) -> {node index: virtual ms it stored that version}
        self.stored: dict[tuple[str, int], dict[int, int]] = {}
        self.latest: dict[str, int] = {}
        device = DEVICES["rtx3090"]

        def cap(node: VirtualNode) -> Any:
            return capability(node, device) if node.index < self.advertisers else None

        spec = ledger_spec(NETWORK_ID, config, cap, self._observe)
        sc = replace(scenario, churn=churn)
        self.swarm: Swarm = build_swarm(sc, nodes, seed, lambda i: (spec,))
        self.churn: Churn | None = None
        if churn.active:
            self.churn = Churn(
                self.swarm,
                sc,
                lambda i: (spec,),
                protected=frozenset(range(self.advertisers)),
                start_ms=int(workload_value(scenario, "warmup_s", 30.0) * 1000),
            )
        self.updates: list[tuple[str, int, int, array[int]]] = []  # peer, seq, at, epochs
        self._pending: dict[str, int] = {}
        self._asked = 0
        self.freshness: list[tuple[float, float]] = []

    def _observe(self, node: VirtualNode, effect: object) -> None:
        if isinstance(effect, StoreCapability):
            rec = effect.record
            now = self.swarm.now_ms
            self.stored.setdefault((rec.peer_id, rec.seq), {})[node.index] = now
            if rec.peer_id == node.peer_id:  # our own new version: it goes out now
                self.latest[rec.peer_id] = max(self.latest.get(rec.peer_id, 0), rec.seq)
                pending = self._pending.pop(rec.peer_id, None)
                if pending is not None:
                    # each node's incarnation now (0: down), by index
                    epochs = array("l", [n.epoch if n.up else 0 for n in self.swarm.nodes])
                    self.updates.append((rec.peer_id, rec.seq, now, epochs))

    def update(self, advertiser: int) -> None:
        """Change an advertiser's load; the version it publishes is recorded when stored."""
        node = self.swarm.nodes[advertiser]
        load = round(0.1 + 0.8 * ((self._asked * 7919) % 97) / 97, 3)
        self._asked += 1
        self._pending[node.peer_id] = self._asked
        node.submit(NAME, SetLoad(free_slots=1, load=load))

    def sample_freshness(self) -> None:
        live = [n for n in self.swarm.nodes if n.up]
        want = [(p, self.latest[p]) for p in sorted(self.latest)]
        fresh = 0
        for node in live:  # every live node, every advertiser: a plain loop, left at the first miss
            held = ledger_of(node).state.records.get
            for peer, seq in want:
                h = held(peer)
                if h is None or h.record.seq < seq:
                    break
            else:
                fresh += 1
        self.freshness.append((self.swarm.now_ms / 1000.0, fresh / max(1, len(live))))

    def convergence(self) -> list[dict[str, float]]:
        out = []
        for peer, seq, at, epochs in self.updates:
            times = self.stored.get((peer, seq), {})
            steady = [
                i
                for i, e in enumerate(epochs)
                if e
                and self.swarm.nodes[i].up
                and self.swarm.nodes[i].epoch == e
                and self.swarm.nodes[i].peer_id != peer
            ]
            got = sorted(times[i] - at for i in steady if i in times)
            missing = len(steady) - len(got)
            row = {
                "t50_ms": percentile(got, 0.5) if got else -1.0,
                "t99_ms": percentile(got, 0.99) if got else -1.0,
                "t100_ms": float(got[-1]) if got and not missing else -1.0,
                "reached": len(got) / max(1, len(steady)),
            }
            out.append(row)
        return out


def measure(
    scenario: Scenario, nodes: int, churn: ChurnSpec, label: str, progress: Progress = no_progress
) -> dict[str, Any]:
    """One sweep point: ``nodes`` under ``churn`` (picklable in and out: a worker may run it)."""
    stages = Stages(progress, [1.0])
    warmup_ms = int(workload_value(scenario, "warmup_s", 30.0) * 1000)
    interval_ms = int(workload_value(scenario, "update_interval_s", 10.0) * 1000)
    updates = int(workload_value(scenario, "updates", 8))
    sample_ms = int(workload_value(scenario, "sample_s", 5.0) * 1000)
    settle_ms = int(workload_value(scenario, "settle_s", 60.0) * 1000)
    run = LedgerRun(scenario, nodes, scenario.seed, churn)
    swarm = run.swarm
    stages.run(swarm, warmup_ms, label)
    before = dict(swarm.metrics.bytes_by_kind)
    start_ms = swarm.now_ms
    rng = derive_rng(scenario.seed, "ledger-updates")
    end_ms = warmup_ms + updates * interval_ms + settle_ms
    for t in range(warmup_ms, end_ms, sample_ms):
        swarm.at_ms(t, run.sample_freshness)
    for u in range(updates):
        swarm.at_ms(warmup_ms + u * interval_ms + 1, run.update, rng.randrange(run.advertisers))
    stages.run(swarm, end_ms, label)
    window_s = (swarm.now_ms - start_ms) / 1000.0
    by_kind = window_bytes(swarm, before)
    total = sum(by_kind.values())
    anti = sum(v for k, v in by_kind.items() if k in ANTI_ENTROPY_KINDS)
    conv = run.convergence()
    t100 = [c["t100_ms"] for c in conv if c["t100_ms"] >= 0]
    t99 = [c["t99_ms"] for c in conv if c["t99_ms"] >= 0]
    live = sum(1 for n in swarm.nodes if n.up)
    # bytes sent+received, counted once on each side: per node and minute
    per_node_min = 2 * total / max(1, len(swarm.nodes)) / (window_s / 60.0)
    fresh = [f for _, f in run.freshness]
    return {
        "nodes": nodes,
        "crash_per_min": churn.crash_per_min,
        "advertisers": run.advertisers,
        "updates": len(conv),
        "converged_updates": len(t100),
        "t50_ms_median": percentile([c["t50_ms"] for c in conv if c["t50_ms"] >= 0], 0.5),
        "t99_ms_median": percentile(t99, 0.5),
        "t100_ms_median": percentile(t100, 0.5),
        "t100_ms_max": max(t100) if t100 else -1.0,
        "reached_min": min((c["reached"] for c in conv), default=0.0),
        "bytes_per_node_per_min": per_node_min,
        "gossip_share": (total - anti) / total if total else 0.0,
        "anti_entropy_bytes_per_node_per_min": 2
        * anti
        / max(1, len(swarm.nodes))
        / (window_s / 60.0),
        "freshness_mean": sum(fresh) / len(fresh) if fresh else 0.0,
        "freshness_min": min(fresh) if fresh else 0.0,
        "live_nodes_end": live,
        "events": swarm.loop.events_run,
        "churn": run.churn.summary() if run.churn else {},
        "_freshness": run.freshness,
        "_bytes_summary": summary([float(b) for b in swarm.bytes_per_node()]),
    }


def run(scenario: Scenario, progress: Progress, points: SweepPoints | None = None) -> Report:
    """The sweep: sizes, then churn rates; its points run where ``points`` says (here, one
    after another, by default)."""
    sweep_nodes = (
        [scenario.nodes]
        if scenario.nodes_overridden
        else [int(n) for n in scenario.sweep.get("nodes", [100, 300, 1000, 3000, 10000])]
    )
    churn_nodes = (
        scenario.nodes if scenario.nodes_overridden else int(scenario.sweep.get("churn_nodes", 500))
    )
    churn_rates = [
        float(c) for c in scenario.sweep.get("churn_crash_per_min", [0.0, 0.01, 0.05, 0.1])
    ]
    args = [(scenario, n, ChurnSpec(), f"ledger N={n}") for n in sweep_nodes] + [
        (scenario, churn_nodes, replace(scenario.churn, crash_per_min=rate), f"churn {rate}/min")
        for rate in churn_rates
    ]
    weights = [float(n) for n in sweep_nodes] + [float(churn_nodes)] * len(churn_rates)
    rows = (points or LocalPoints(progress)).map(Sweep(measure, args, weights, scenario.name))
    size_rows, churn_rows = rows[: len(sweep_nodes)], rows[len(sweep_nodes) :]
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=_headline(size_rows, churn_rows),
        results={"by_nodes": _public(size_rows), "by_churn": _public(churn_rows)},
        plots=_size_plots(size_rows) + _churn_plots(churn_rows, churn_nodes),
        invariants={
            "every_update_reached_every_steady_node_without_churn": all(
                r["reached_min"] == 1.0 for r in size_rows
            ),
        },
        notes=[
            "Steady nodes: up from the update until the end of the run without a restart; "
            "restarted nodes catch up by anti-entropy and show in freshness.",
            f"{size_rows[0]['advertisers']} advertisers publish records; all other nodes "
            "replicate them (light nodes).",
        ],
    )


def _public(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without their plot-only entries (keys starting with ``_``)."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def _headline(size_rows: list[dict[str, Any]], churn_rows: list[dict[str, Any]]) -> dict[str, Any]:
    biggest = size_rows[-1]
    return {
        "largest_n": biggest["nodes"],
        "t99_s_at_largest_n": biggest["t99_ms_median"] / 1000,
        "t100_s_at_largest_n": biggest["t100_ms_median"] / 1000,
        "kB_per_node_per_min_at_largest_n": biggest["bytes_per_node_per_min"] / 1000,
        "freshness_mean_at_highest_churn": churn_rows[-1]["freshness_mean"] if churn_rows else None,
    }


def _size_plots(size_rows: list[dict[str, Any]]) -> list[Plot]:
    xs = [float(r["nodes"]) for r in size_rows]

    def per_n(label: str, key: str) -> Series:
        """Each row's ``key`` over 1000 (ms to s, bytes to kB) against the network size."""
        return Series(label, xs, [r[key] / 1000 for r in size_rows])

    return [
        Plot("convergence_vs_n", "Time for a record update to reach the nodes", "nodes (N)",
             "seconds after the update", logx=True,
             series=[per_n("50% of nodes", "t50_ms_median"),
                     per_n("99% of nodes", "t99_ms_median"),
                     per_n("all nodes (median update)", "t100_ms_median"),
                     per_n("all nodes (slowest update)", "t100_ms_max")]),
        Plot("bytes_vs_n", "Ledger traffic per node (sent + received)", "nodes (N)",
             "kB per node per minute", logx=True,
             series=[per_n("total", "bytes_per_node_per_min"),
                     per_n("anti-entropy", "anti_entropy_bytes_per_node_per_min")]),
    ]


def _churn_plots(churn_rows: list[dict[str, Any]], churn_nodes: int) -> list[Plot]:
    rates = [r["crash_per_min"] for r in churn_rows]
    return [
        Plot(
            "freshness_churn",
            f"Freshness under churn ({churn_nodes} nodes)",
            "virtual seconds",
            "fraction of live nodes with every newest record",
            series=[
                Series(
                    f"{r['crash_per_min']:g} crashes/node/min",
                    [t for t, _ in r["_freshness"]],
                    [f for _, f in r["_freshness"]],
                )
                for r in churn_rows
            ],
        ),
        Plot(
            "convergence_vs_churn",
            f"Update convergence under churn ({churn_nodes} nodes)",
            "crashes per node per minute",
            "seconds",
            series=[
                Series(
                    "99% of steady nodes", rates, [r["t99_ms_median"] / 1000 for r in churn_rows]
                ),
                Series(
                    "all steady nodes (median update)",
                    rates,
                    [r["t100_ms_median"] / 1000 for r in churn_rows],
                ),
            ],
        ),
    ]
