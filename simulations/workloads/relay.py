"""Relay: time for N peers to receive S bytes, star vs chain vs one tree vs the striped plan,
versus N and chunk size, against the S/B limit of one link; then the striped plan against the
single tree with heterogeneous links, free riders, and peers leaving mid-transfer.

One publisher signs a manifest (protocol.relay.manifest) for an artifact of ``size_mib`` MiB
naming N recipients, and every node runs the real ``RelayMachine``; chunks move as sized
transfers over the network model (each node's uplink and downlink: ``link_mbps``), so what is
measured is the protocol's plan and pipelining, not Python's speed.

Topologies (all through the same machine and manifest):
* ``star``: recipients advertise no upload capacity (1 B/s) and ``max_fanout`` = N, so the
  plan hangs every peer under the publisher: the publisher's uplink serves N copies (N*S/B);
* ``chain``: ``max_fanout`` = 1: a pipeline through every peer (S/B + N chunk times);
* ``plan``: the single bandwidth-aware tree (default fan-out), the relay plan before stripes;
* ``striped``: the protocol's striped plan (protocol/relay/striping.py), what a real network
  runs: up to ``DEFAULT_STRIPES`` trees (the count with the smallest estimate), each node
  interior in at most one.

Goal runs at ``goal_nodes`` peers (at most ``chunk_nodes`` or ``--nodes``), ``plan`` against
``striped``:
* heterogeneous links: a share of each rate in ``hetero_mbps``, up and down; the ratio is
  against the ideal (simulations/workloads/relay_world.py ``ideal_s``);
* free riders (``free_rider_share``): they download and never upload. Version 1 finds them
  (their children attest ``RELAY_WITHHELD``); version 2's manifest makes them leaves
  (protocol/relay/recipients.py); the ratio is version 2's, version 1's is reported beside;
* leaving: ``leave_share`` of the peers crash halfway through S/B; the rest must complete.

The headline puts ``striped_ratio`` and ``tree_ratio`` (time / (S/B) at the largest N) side
by side, and the same for every goal run.

``[workload]``: ``size_mib`` (256), ``link_mbps`` (100), ``window`` (8), ``chunk_mib`` (1.0),
``free_rider_share`` (0.1), ``hetero_mbps`` ([10, 50, 100, 1000]), ``leave_share`` (0.05).
``[sweep]``: ``nodes`` ([10, 30, 100, 300, 1000]), ``topologies`` (["star", "chain", "plan",
"striped"]), ``chunk_mib`` ([1, 4, 16, 64]), ``chunk_nodes`` (100), ``star_max_nodes`` (30),
``goal_nodes`` (300).
With ``--nodes`` only ``plan`` and ``striped`` run, at that N, without the chunk sweep.
simulations/scenarios/relay-10k.toml runs the equal-link case at 10,000 peers.
"""

from __future__ import annotations

from typing import Any

from protocol.relay.manifest import Manifest
from simulations.runner.report import Plot, Report, Series
from simulations.scenario import Scenario, workload_value
from simulations.workloads.common import Progress, Stages
from simulations.workloads.relay_plan_stats import plan_shape
from simulations.workloads.relay_world import (
    MIB,
    RelayRun,
    build_world,
    fanout_of,
    ideal_s,
    relay_version,
    stripes_of,
)

QUESTION = (
    "How long do N peers take to receive S bytes through the pipelined relay, star vs "
    "chain vs one tree vs the striped plan, versus N and chunk size, compared with S/B; and "
    "with mixed links, free riders and peers leaving?"
)


def _row(run: RelayRun, manifest: Manifest, start_ms: int, chunk_mib: float) -> dict[str, Any]:
    honest = run.honest_present()
    done = run.done.get(manifest.id, {})
    times = sorted(done[i] - start_ms for i in honest if i in done)
    complete = len(times) == len(honest)
    total_s = times[-1] / 1000 if complete else -1.0
    shape = plan_shape(
        manifest, max_fanout=fanout_of(run.topology, run.n), stripes=stripes_of(run.topology)
    )
    metrics = run.swarm.metrics
    return {
        "topology": run.topology,
        "nodes": run.n,
        "chunk_mib": chunk_mib,
        "size_mib": run.size / MIB,
        "free_riders": len(run.riders),
        "left": len(run.left),
        "complete": complete,
        "completed": len(times),
        "time_s": total_s,
        "s_over_b_s": run.s_over_b,
        "ratio_vs_s_over_b": total_s / run.s_over_b if complete else -1.0,
        "median_peer_s": times[len(times) // 2] / 1000 if times else -1.0,
        "plan_depth": shape["depth"],
        "plan_fanout": shape["fanout"],
        "unpublished_deliveries": metrics.counters.get("relay.unpublished_delivery", 0),
        "serve_unheld": metrics.counters.get("relay.serve_unheld", 0),
        "chunk_bytes": metrics.bytes_by_kind.get("chunk", 0),
        "events": run.swarm.loop.events_run,
    }


def _plain(scenario: Scenario, stages: Stages, t: str, n: int, c: float) -> dict[str, Any]:
    run = build_world(scenario, n, t, c)
    manifest, start = relay_version(run, stages, f"relay {t} N={n} chunk={c:g}MiB")
    return _row(run, manifest, start, c)


def _riders(scenario: Scenario, stages: Stages, t: str, n: int, c: float) -> dict[str, Any]:
    share = float(workload_value(scenario, "free_rider_share", 0.1))
    run = build_world(scenario, n, t, c, free_riders=share)
    first, start = relay_version(run, stages, f"relay {t} N={n} free riders v1")
    first_row = _row(run, first, start, c)
    index = {node.peer_id: node.index for node in run.swarm.nodes}
    reported = {index[s] for s, _ in run.withheld}
    second, start = relay_version(run, stages, f"relay {t} N={n} free riders v2", version=2)
    row = _row(run, second, start, c)
    row.update(
        goal="free_riders",
        first_version_ratio=first_row["ratio_vs_s_over_b"],
        first_version_complete=first_row["complete"],
        riders_reported=len(reported & run.riders),
        honest_reported=len(reported - run.riders),
    )
    return row


def _hetero(scenario: Scenario, stages: Stages, t: str, n: int, c: float) -> dict[str, Any]:
    mix = tuple(float(r) for r in workload_value(scenario, "hetero_mbps", [10, 50, 100, 1000]))
    run = build_world(scenario, n, t, c, mix=mix)
    manifest, start = relay_version(run, stages, f"relay {t} N={n} mixed links")
    row = _row(run, manifest, start, c)
    ideal = ideal_s(run)
    row.update(goal="hetero", ideal_s=ideal,
               ratio_vs_ideal=row["time_s"] / ideal if row["complete"] else -1.0)
    return row


def _leave(scenario: Scenario, stages: Stages, t: str, n: int, c: float) -> dict[str, Any]:
    share = float(workload_value(scenario, "leave_share", 0.05))
    run = build_world(scenario, n, t, c)
    manifest, start = relay_version(run, stages, f"relay {t} N={n} leave", leave_share=share)
    row = _row(run, manifest, start, c)
    row.update(goal="leave")
    return row


Run = tuple[str, int, float]  # topology, nodes, chunk MiB
GOALS = {"free_riders": _riders, "hetero": _hetero, "leave": _leave}


def _node_list(scenario: Scenario) -> list[int]:
    if scenario.nodes_overridden:
        return [scenario.nodes]
    return [int(n) for n in scenario.sweep.get("nodes", [10, 30, 100, 300, 1000])]


def _chunk_nodes(scenario: Scenario) -> int:
    if scenario.nodes_overridden:
        return scenario.nodes
    return int(scenario.sweep.get("chunk_nodes", 100))


def _topologies(scenario: Scenario) -> list[str]:
    names = [str(t) for t in scenario.sweep.get("topologies", ["star", "chain", "plan", "striped"])]
    unknown = sorted(set(names) - {"star", "chain", "plan", "striped"})
    if unknown:
        raise ValueError(f"unknown relay topologies {unknown}: use star, chain, plan, striped")
    if scenario.nodes_overridden:
        return [t for t in names if t in ("plan", "striped")]
    return names


def _runs(scenario: Scenario, topologies: list[str], chunk_default: float) -> list[Run]:
    """Every topology over the node counts (the star to ``star_max_nodes``: it thrashes
    beyond), then every chunk size at chunk_nodes (not with ``--nodes``)."""
    chunk_list = [float(c) for c in scenario.sweep.get("chunk_mib", [1, 4, 16, 64])]
    star_max = int(scenario.sweep.get("star_max_nodes", 30))
    runs: list[Run] = [
        (t, n, chunk_default)
        for t in topologies
        for n in _node_list(scenario)
        if t != "star" or n <= star_max
    ]
    if not scenario.nodes_overridden:
        runs += [
            (t, _chunk_nodes(scenario), c)
            for t in topologies
            if t != "star"
            for c in chunk_list
            if c != chunk_default
        ]
    return runs


def _goal_nodes(scenario: Scenario) -> int:
    """Goal runs use ``goal_nodes`` peers (300), fewer if the sweep or ``--nodes`` asks for
    fewer: at 1,000 they would take the run past its few minutes."""
    return min(_chunk_nodes(scenario), int(scenario.sweep.get("goal_nodes", 300)))


def _goal_runs(scenario: Scenario, topologies: list[str]) -> list[tuple[str, str]]:
    """(goal, topology) for the single tree and the striped plan, goals whose share is > 0."""
    goals = ["hetero"]
    if float(workload_value(scenario, "free_rider_share", 0.1)) > 0:
        goals.append("free_riders")
    if float(workload_value(scenario, "leave_share", 0.05)) > 0:
        goals.append("leave")
    return [(g, t) for g in goals for t in ("plan", "striped") if t in topologies]


def _time_vs_n(
    rows: list[dict[str, Any]], topologies: list[str], node_list: list[int], chunk_default: int
) -> Plot:
    by_n = [r for r in rows if r["chunk_mib"] == chunk_default and "goal" not in r]
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
        f"Time for N peers to receive {rows[0]['size_mib']:g} MiB ({chunk_default:g} MiB chunks)",
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
            if r["nodes"] == chunk_nodes and "goal" not in r and r["topology"] != "star"
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
    rows: list[dict[str, Any]], topologies: list[str], chunk_default: float
) -> dict[str, Any]:
    by_n = [r for r in rows if r["chunk_mib"] == chunk_default and "goal" not in r]
    largest = max(r["nodes"] for r in by_n)
    headline: dict[str, Any] = {"s_over_b_s": rows[0]["s_over_b_s"], "largest_n": largest}
    for t, key in (("plan", "tree"), ("striped", "striped")):
        mine = [r for r in by_n if r["topology"] == t and r["nodes"] == largest]
        if mine:
            headline[f"{key}_ratio"] = mine[0]["ratio_vs_s_over_b"]
        for r in (r for r in rows if r.get("goal") and r["topology"] == t):
            if r["goal"] == "hetero":
                headline[f"{key}_mixed_links_ratio_vs_ideal"] = r["ratio_vs_ideal"]
                headline["mixed_links_ideal_s"] = r["ideal_s"]
                headline["goal_nodes"] = r["nodes"]
            elif r["goal"] == "free_riders":
                headline[f"{key}_with_free_riders_ratio"] = r["ratio_vs_s_over_b"]
                headline[f"{key}_with_free_riders_first_version_ratio"] = r[
                    "first_version_ratio"
                ]
                headline[f"{key}_free_riders_reported"] = r["riders_reported"]
            else:
                headline[f"{key}_after_leave_ratio"] = r["ratio_vs_s_over_b"]
                headline[f"{key}_after_leave_complete"] = r["complete"]
    for t in topologies:
        mine = [r for r in by_n if r["topology"] == t]
        if mine:
            row = max(mine, key=lambda r: r["nodes"])
            headline[f"{t}_ratio_vs_s_over_b_at_n{row['nodes']}"] = row["ratio_vs_s_over_b"]
    return headline


def _notes(star_max: int) -> list[str]:
    return [
        "Each node's uplink and downlink run at link_mbps (mixed links: a share at each of "
        "hetero_mbps); S/B is one link's transfer time. Free riders take chunks and never "
        "serve; their children re-attach after the relay machine's stall timeout and attest "
        "them, and the next version's plan makes them leaves.",
        f"Star runs stop at N={star_max}: past N*chunk/B > stall timeout (30 s) each peer "
        "waits longer than the stall timeout between chunks, drops the publisher as a "
        "source and re-requests, and the star thrashes (seen at N=100, 4 MiB chunks).",
    ]


def run(scenario: Scenario, progress: Progress) -> Report:
    topologies = _topologies(scenario)
    chunk_default = float(workload_value(scenario, "chunk_mib", 1.0))
    runs = _runs(scenario, topologies, chunk_default)
    goals = _goal_runs(scenario, topologies)
    weights = [float(n * (n if t == "star" else 4)) for t, n, _ in runs]
    weights += [float(_goal_nodes(scenario) * (8 if g == "free_riders" else 4)) for g, _ in goals]
    stages = Stages(progress, weights)
    rows = [_plain(scenario, stages, t, n, c) for t, n, c in runs]
    rows += [GOALS[g](scenario, stages, t, _goal_nodes(scenario), chunk_default)
             for g, t in goals]
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
