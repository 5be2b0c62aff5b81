"""`symphony bench scale`: many light daemons on one machine, and the simulator's prediction.

Starts ``--nodes`` light daemons (node/bench/scale/daemons.py), changes ``UPDATES`` nodes'
capability records and reports, from the daemons:

* ``converged_s``: per update, the latest arrival of the new version at any node minus its
  signing (one machine's clock); the median over the updates (``converged_s_max`` the worst);
* ``gossip_bytes_per_node_min``: gossip message bytes each daemon received (duplicates
  included), per minute over the window, mean over daemons;
* ``rss_mb_per_daemon`` (mean) and ``rss_mb_max``; ``peers_per_node``: mean ready peers;
  ``peers_dropped``: peers each daemon's membership had dropped by then (mean), and
  ``peers_dropped_by_reason`` (totals); ``daemon_cores``: the cores the daemons used together
  over the window (from /proc: near the machine's core count, they were short of CPU);
* ``start_s``: wall time to start them all (``batch`` at a time).

Then simulations/workloads/testnet.py runs the same protocol code for the same testnet (start
times, topology and measured link latencies, each node's processing delay drawn from the
measured gossip hops, records, updates) and its predictions are
reported as ``sim_<key>``; ``sim_prediction_error`` is the largest relative error of the
predictions of ``converged_s``, ``gossip_bytes_per_node_min`` and ``peers_per_node``.

``--quick``: 5 daemons, 2 updates. Full: ``--nodes`` (default 100), 5 updates.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from node.bench.scale.daemons import (
    CONFIG,
    SETTLE_S,
    WINDOW_S,
    Measured,
    daemon_cores,
    gossip_bytes_per_node_min,
    gossip_hop_ms,
    gossip_hop_range_ms,
    measure,
    processing_ms,
    window_ms,
)
from node.daemon import LIGHT_PROFILE
from node.membership.service import MembershipSection, agent_version
from node.testnet import LocalTestnet
from protocol.ledger.machine import CapabilitySpec, LedgerConfig
from protocol.ledger.records import HardwareSummary, ModelOffer, Role
from protocol.membership.machine import MembershipConfig
from simulations.workloads.testnet import DaemonNet, Update, predict

NETWORK_ID = "bench-scale"
DEFAULT_NODES = 100
QUICK_NODES = 5
#: five updates: converged_s is a median of each one's last arrival, a long-tailed figure
UPDATES, QUICK_UPDATES = 5, 2
#: the measurement window from the first update, seconds (it must outlast convergence)
QUICK_WINDOW_S = 10.0
#: daemons started at once
BATCH = 10
#: the figures the simulator predicts (``sim_prediction_error`` is over these)
PREDICTED = ("converged_s", "gossip_bytes_per_node_min", "peers_per_node")


def run(quick: bool, nodes: int | None = None) -> dict[str, Any]:
    if quick:
        return scale(nodes or QUICK_NODES, QUICK_UPDATES, QUICK_WINDOW_S)
    return scale(nodes or DEFAULT_NODES, UPDATES, WINDOW_S)


def scale(nodes: int, updates: int, window_s: float, batch: int = BATCH,
          settle_s: float = SETTLE_S) -> dict[str, Any]:
    """Measure ``nodes`` light daemons (``updates`` record changes, a ``window_s`` window),
    then predict the same with the simulator; the figures of both (module docstring)."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="symphony-bench-scale-") as tmp:
        net = LocalTestnet(Path(tmp), network_id=NETWORK_ID, config=CONFIG, light=True)
        try:
            measured = measure(net, nodes, updates, batch, window_s, settle_s)
        finally:
            net.kill_all()
    figures = figures_of(measured)
    sim_began = time.monotonic()
    predicted = predict(testnet_of(measured))
    figures["sim_s"] = time.monotonic() - sim_began
    figures.update({f"sim_{key}": value for key, value in predicted.items()})
    figures["sim_prediction_error"] = max(
        relative_error(predicted[key], figures[key]) for key in PREDICTED)
    figures["wall_s"] = time.monotonic() - began
    return figures


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured (infinite when nothing was measured but predicted)."""
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return abs(predicted - measured) / abs(measured)


def figures_of(m: Measured) -> dict[str, Any]:
    worst = [max(a.values()) if a else 0 for a in m.arrivals]
    received = [b.gossip_messages - a.gossip_messages for a, b in zip(m.before, m.after, strict=True)]
    received_bytes = [b.gossip_bytes - a.gossip_bytes for a, b in zip(m.before, m.after, strict=True)]
    return {
        "nodes": len(m.names),
        "updates": len(m.updates),
        "converged_s": statistics.median(worst) / 1000,
        "converged_s_max": max(worst) / 1000,
        "gossip_bytes_per_node_min": gossip_bytes_per_node_min(m),
        "gossip_message_bytes": sum(received_bytes) / max(1, sum(received)),
        "gossip_copies_per_node": statistics.fmean(received),
        "window_s": window_ms(m) / 1000,
        "rss_mb_per_daemon": statistics.fmean(m.rss_mb),
        "rss_mb_max": max(m.rss_mb),
        "peers_per_node": statistics.fmean(len(s.peers) for s in m.before),
        "peers_max": max(len(s.peers) for s in m.before),
        "peers_dropped": statistics.fmean(sum(s.dropped.values()) for s in m.before),
        "peers_dropped_by_reason": dropped_by_reason(m),
        "daemon_cores": daemon_cores(m),
        "gossip_hop_ms": gossip_hop_ms(m),
        "gossip_hop_range_ms": list(gossip_hop_range_ms(m)),
        "start_s": m.start_s,
    }


def dropped_by_reason(m: Measured) -> dict[str, int]:
    """Peers the daemons' membership dropped before the updates, by reason (totals)."""
    total: dict[str, int] = {}
    for snap in m.before:
        for reason, count in snap.dropped.items():
            total[reason] = total.get(reason, 0) + count
    return dict(sorted(total.items()))


def testnet_of(m: Measured) -> DaemonNet:
    """The simulator's input: what the daemons were and did (simulations/workloads/testnet.py)."""
    index = {peer: i for i, peer in enumerate(m.peer_ids)}
    edges: set[tuple[int, int]] = set()
    rtts: dict[tuple[int, int], list[float]] = {}
    for i, snap in enumerate(m.before):
        for peer, rtt in snap.peers.items():
            j = index.get(peer)
            if j is None or j == i:
                continue
            key = (min(i, j), max(i, j))
            edges.add(key)
            if rtt == rtt:  # not nan: a round trip was measured
                rtts.setdefault(key, []).append(rtt)
    first = m.updates[0][2] if m.updates else 0
    net = DaemonNet(
        start_ms=tuple(m.start_ms),
        bootstraps=tuple(tuple(b) for b in m.bootstraps),
        specs=tuple(spec_of(r["record"]) for r in m.records),
        edges=tuple(sorted(edges)),
        latency_ms={k: max(0.05, statistics.fmean(v) / 2) for k, v in rtts.items()},
        updates=tuple(Update(at_ms=offset - first, node=i, spec=spec_of(rec))
                      for i, rec, offset in m.updates),
        window_ms=window_ms(m),
        peers_at_ms=m.peers_at_ms,
        membership=MembershipConfig(network_id=NETWORK_ID, agent_version=agent_version(),
                                    **daemons_section("membership")),
        discovery=MembershipSection().discovery_config(NETWORK_ID),
        ledger=LedgerConfig(**{k: v for k, v in CONFIG["ledger"].items()}),
    )
    # each hop less the latency of the link it came over: the receiving daemon's processing
    return replace(net, processing_ms=tuple(processing_ms(m, net.link_ms)))


def daemons_section(name: str) -> dict[str, Any]:
    """The keys of section ``name`` the bench's daemons ran with beyond the defaults: a light
    daemon's profile (node/daemon.py), under the bench's own CONFIG."""
    return {**LIGHT_PROFILE.get(name, {}), **CONFIG.get(name, {})}


def spec_of(record: dict[str, Any]) -> CapabilitySpec:
    """The capability a daemon advertised, from its record's JSON (node/ledger/api.py)."""
    return CapabilitySpec(
        listen_addrs=tuple(record["listen_addrs"]),
        models=tuple(ModelOffer(name=o["name"], family=o["family"],
                                quantization=o["quantization"],
                                context_length=o["context_length"],
                                weights_hash=bytes.fromhex(o["weights_hash"]),
                                tokens_per_s=o["tokens_per_s"]) for o in record["models"]),
        hardware=HardwareSummary(**record["hardware"]),
        price_per_1k_tokens=record["price_per_1k_tokens"],
        free_slots=record["free_slots"],
        max_slots=record["max_slots"],
        load=record["load"],
        roles=tuple(Role(r) for r in record["roles"]),
        tags=tuple(record["tags"]),
        software_version=record["software_version"],
    )
