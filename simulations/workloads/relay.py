"""Relay: time for N peers to receive S bytes, star vs chain vs the protocol's plan, versus N
and chunk size, against the S/B limit of one link.

One publisher signs a manifest (protocol.relay.manifest) for an artifact of ``size_mib`` MiB
naming N recipients, and every node runs the real ``RelayMachine``; chunks move as sized
transfers over the network model (each node's uplink and downlink: ``link_mbps``), so what is
measured is the protocol's plan and pipelining, not Python's speed.

Topologies (all through the same machine and manifest):
* ``star``: recipients advertise no upload capacity (1 B/s) and ``max_fanout`` = N, so the
  plan hangs every peer under the publisher: the publisher's uplink serves N copies (N*S/B);
* ``chain``: ``max_fanout`` = 1: a pipeline through every peer (S/B + N chunk times);
* ``plan``: the protocol's bandwidth-aware plan (default fan-out), what a real network runs.

``[workload]``: ``size_mib`` (256), ``link_mbps`` (100), ``window`` (8), ``chunk_mib`` (4),
``free_rider_share`` (0.1, for the robustness run). ``[sweep]``: ``nodes`` ([10, 30, 100,
300, 1000]), ``topologies`` (["star", "chain", "plan"]), ``chunk_mib`` ([1, 4, 16, 64]),
``chunk_nodes`` (100).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from crypto.hashing import digest
from protocol.relay.manifest import Manifest, make_body, sign_manifest
from simulations.adversary import FreeRider
from simulations.machines.relay import Published, publish, relay_spec
from simulations.network import MBIT
from simulations.node import VirtualNode
from simulations.relay_plan_stats import plan_shape
from simulations.report import Plot, Report, Series
from simulations.scenario import BandwidthClass, Scenario, workload_value
from simulations.swarm import Swarm, derive_rng
from simulations.workloads.common import Progress, Stages
from simulations.world import build_swarm

QUESTION = (
    "How long do N peers take to receive S bytes through the pipelined relay, star vs "
    "chain vs the protocol's plan, versus N and chunk size, compared with S/B?"
)
MIB = 1 << 20
STAR_ADVERTISED_BPS = 1
#: the run stops this long after the S/B * N bound, complete or not
MAX_RUN_FACTOR = 1.5
#: virtual time at which the publisher announces the version
START_MS = 1_000


@dataclass
class RelayRun:
    """One run's world: the swarm, the manifest it relays, and who finished when."""

    swarm: Swarm
    manifest: Manifest
    published: Published
    size: int
    s_over_b: float
    riders: set[int]
    done: dict[int, int] = field(default_factory=dict)


def _fanout(topology: str, n: int) -> int:
    return n if topology == "star" else (1 if topology == "chain" else 8)


def _world(
    scenario: Scenario, n: int, topology: str, chunk_mib: int, free_riders: float
) -> RelayRun:
    """N + 1 nodes on equal links, a signed manifest naming the N recipients, free riders."""
    size = int(float(workload_value(scenario, "size_mib", 256.0)) * MIB)
    chunk = chunk_mib * MIB
    link_bps = float(workload_value(scenario, "link_mbps", 100.0)) * MBIT
    sc = replace(
        scenario,
        network=replace(scenario.network, bandwidth=(BandwidthClass(1.0, link_bps, link_bps),)),
    )
    rng = derive_rng(scenario.seed, f"relay/{n}/{topology}/{chunk_mib}/{free_riders}")
    riders = set(rng.sample(range(1, n + 1), round(free_riders * n))) if free_riders else set()
    published = Published()
    done: dict[int, int] = {}

    def on_complete(node: VirtualNode, manifest: Any) -> None:
        done.setdefault(node.index, node.swarm.now_ms)

    spec = relay_spec(
        max_fanout=_fanout(topology, n),
        window=int(workload_value(scenario, "window", 8)),
        published=published,
        on_complete=on_complete,
        behaviour_of=lambda node: FreeRider() if node.index in riders else None,
    )
    swarm = build_swarm(sc, n + 1, scenario.seed, lambda i: (spec,))
    chunks = -(-size // chunk)
    hashes = [digest(f"{scenario.seed}/{i}".encode(), person=b"sim-chunk") for i in range(chunks)]
    advertised = STAR_ADVERTISED_BPS if topology == "star" else int(link_bps)
    body = make_body(
        name="weights",
        version=1,
        chunk_size=chunk,
        chunk_hashes=hashes,
        total_size=size,
        publisher_upload_bps=int(link_bps),
        recipients=[(swarm.nodes[i].peer_id, advertised) for i in range(1, n + 1)],
    )
    manifest = sign_manifest(swarm.nodes[0].identity, body)
    return RelayRun(swarm, manifest, published, size, size / link_bps, riders, done)


def _drive(world: RelayRun, stages: Stages, n: int, label: str) -> None:
    """Publish at START_MS and run in slices until every honest peer is done or time is up."""
    swarm = world.swarm
    swarm.at_ms(START_MS, publish, swarm.nodes[0], world.manifest, world.published)
    s_over_b = world.s_over_b
    limit_ms = START_MS + int(max(s_over_b * n, s_over_b * 4) * 1000 * MAX_RUN_FACTOR) + 120_000
    honest = n - len(world.riders)
    t = START_MS
    step = max(1_000, int(s_over_b * 1000 / 4))
    while t < limit_ms and sum(1 for i in world.done if i not in world.riders) < honest:
        t = min(limit_ms, t + step)
        stages.run(swarm, t, label)
    stages.next()


def _run(
    scenario: Scenario,
    stages: Stages,
    *,
    n: int,
    topology: str,
    chunk_mib: int,
    free_riders: float = 0.0,
) -> dict[str, Any]:
    world = _world(scenario, n, topology, chunk_mib, free_riders)
    _drive(world, stages, n, f"relay {topology} N={n} chunk={chunk_mib}MiB")
    honest = [i for i in range(1, n + 1) if i not in world.riders]
    times = sorted(world.done[i] - START_MS for i in honest if i in world.done)
    complete = len(times) == len(honest)
    total_s = times[-1] / 1000 if complete else -1.0
    shape = plan_shape(world.manifest, max_fanout=_fanout(topology, n))
    metrics = world.swarm.metrics
    return {
        "topology": topology,
        "nodes": n,
        "chunk_mib": chunk_mib,
        "size_mib": world.size / MIB,
        "free_riders": len(world.riders),
        "complete": complete,
        "completed": len(times),
        "time_s": total_s,
        "s_over_b_s": world.s_over_b,
        "ratio_vs_s_over_b": total_s / world.s_over_b if complete else -1.0,
        "median_peer_s": times[len(times) // 2] / 1000 if times else -1.0,
        "plan_depth": shape["depth"],
        "plan_fanout": shape["fanout"],
        "unpublished_deliveries": metrics.counters.get("relay.unpublished_delivery", 0),
        "serve_unheld": metrics.counters.get("relay.serve_unheld", 0),
        "chunk_bytes": metrics.bytes_by_kind.get("chunk", 0),
        "events": world.swarm.loop.events_run,
    }


Run = tuple[str, int, int, float]  # topology, nodes, chunk MiB, free-rider share


def _node_list(scenario: Scenario) -> list[int]:
    if scenario.nodes_overridden:
        return [scenario.nodes]
    return [int(n) for n in scenario.sweep.get("nodes", [10, 30, 100, 300, 1000])]


def _chunk_nodes(scenario: Scenario) -> int:
    if scenario.nodes_overridden:
        return scenario.nodes
    return int(scenario.sweep.get("chunk_nodes", 100))


def _runs(scenario: Scenario, topologies: list[str], chunk_default: int) -> list[Run]:
    """Every topology over the node counts, every chunk size at chunk_nodes, then free riders."""
    chunk_list = [int(c) for c in scenario.sweep.get("chunk_mib", [1, 4, 16, 64])]
    chunk_nodes = _chunk_nodes(scenario)
    riders = float(workload_value(scenario, "free_rider_share", 0.1))
    star_max = int(scenario.sweep.get("star_max_nodes", 30))
    runs: list[Run] = [
        (t, n, chunk_default, 0.0)
        for t in topologies
        for n in _node_list(scenario)
        if t != "star" or n <= star_max or scenario.nodes_overridden
    ]
    runs += [
        (t, chunk_nodes, c, 0.0)
        for t in topologies
        if t != "star"
        for c in chunk_list
        if c != chunk_default
    ]
    if riders > 0:
        runs.append(("plan", chunk_nodes, chunk_default, riders))
    return runs


def _time_vs_n(
    rows: list[dict[str, Any]], topologies: list[str], node_list: list[int], chunk_default: int
) -> Plot:
    by_n = [r for r in rows if r["chunk_mib"] == chunk_default and not r["free_riders"]]
    s_over_b = rows[0]["s_over_b_s"]
    series = [
        Series(
            t,
            [float(r["nodes"]) for r in by_n if r["topology"] == t],
            [r["time_s"] for r in by_n if r["topology"] == t],
        )
        for t in topologies
    ]
    series.append(
        Series(
            "N*S/B (sequential sends)",
            [float(n) for n in node_list],
            [n * s_over_b for n in node_list],
        )
    )
    return Plot(
        "relay_time_vs_n",
        f"Time for N peers to receive {rows[0]['size_mib']:g} MiB ({chunk_default} MiB chunks)",
        "peers (N)",
        "seconds",
        logx=True,
        logy=True,
        hlines=[("S/B", s_over_b)],
        series=series,
    )


def _time_vs_chunk(rows: list[dict[str, Any]], topologies: list[str], chunk_nodes: int) -> Plot:
    by_chunk = sorted(
        (
            r
            for r in rows
            if r["nodes"] == chunk_nodes and not r["free_riders"] and r["topology"] != "star"
        ),
        key=lambda r: r["chunk_mib"],
    )
    series = [
        Series(
            t,
            [float(r["chunk_mib"]) for r in by_chunk if r["topology"] == t],
            [r["ratio_vs_s_over_b"] for r in by_chunk if r["topology"] == t],
        )
        for t in topologies
        if t != "star"
    ]
    return Plot(
        "relay_time_vs_chunk",
        f"Chunk size at N={chunk_nodes}",
        "chunk size (MiB)",
        "time / (S/B)",
        logx=True,
        hlines=[("S/B", 1.0)],
        series=series,
    )


def _headline(
    rows: list[dict[str, Any]], topologies: list[str], chunk_default: int
) -> dict[str, Any]:
    by_n = [r for r in rows if r["chunk_mib"] == chunk_default and not r["free_riders"]]
    largest = max(r["nodes"] for r in by_n)
    headline: dict[str, Any] = {"s_over_b_s": rows[0]["s_over_b_s"], "largest_n": largest}
    for t in topologies:
        mine = [r for r in by_n if r["topology"] == t]
        if mine:
            row = max(mine, key=lambda r: r["nodes"])
            headline[f"{t}_ratio_vs_s_over_b_at_n{row['nodes']}"] = row["ratio_vs_s_over_b"]
    rider_row = next((r for r in rows if r["free_riders"]), None)
    if rider_row is not None:
        headline["plan_with_free_riders_ratio"] = rider_row["ratio_vs_s_over_b"]
        headline["plan_with_free_riders_complete"] = rider_row["complete"]
    return headline


def _notes(star_max: int) -> list[str]:
    return [
        "Each node's uplink and downlink run at link_mbps; S/B is one link's transfer "
        "time. Free riders take chunks and never serve; their children re-attach after "
        "the relay machine's stall timeout.",
        f"Star runs stop at N={star_max}: past N*chunk/B > stall timeout (30 s) each peer "
        "waits longer than the stall timeout between chunks, drops the publisher as a "
        "source and re-requests, and the star thrashes (seen at N=100, 4 MiB chunks).",
    ]


def run(scenario: Scenario, progress: Progress) -> Report:
    topologies = [str(t) for t in scenario.sweep.get("topologies", ["star", "chain", "plan"])]
    chunk_default = int(workload_value(scenario, "chunk_mib", 4))
    runs = _runs(scenario, topologies, chunk_default)
    stages = Stages(progress, [float(n * (n if t == "star" else 4)) for t, n, _, _ in runs])
    rows = [
        _run(scenario, stages, n=n, topology=t, chunk_mib=c, free_riders=f) for t, n, c, f in runs
    ]
    plots = [
        _time_vs_n(rows, topologies, _node_list(scenario), chunk_default),
        _time_vs_chunk(rows, topologies, _chunk_nodes(scenario)),
    ]
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=_headline(rows, topologies, chunk_default),
        results={"runs": rows},
        plots=plots,
        invariants={
            "no_chunk_delivered_that_was_never_published": all(
                r["unpublished_deliveries"] == 0 for r in rows
            ),
            "no_chunk_served_that_was_not_held": all(r["serve_unheld"] == 0 for r in rows),
            "every_honest_peer_completed": all(r["complete"] for r in rows),
        },
        notes=_notes(int(scenario.sweep.get("star_max_nodes", 30))),
    )
