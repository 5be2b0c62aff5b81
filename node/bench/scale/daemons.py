"""The daemons' side of ``bench scale``: a light testnet, a few record updates, what they cost.

:func:`measure` starts ``nodes`` light daemons (``node run --light``: membership, discovery,
ledger, relay; no model) ``batch`` at a time, each bootstrapping from ``BOOTSTRAP_SPREAD``
running ones as ``symphony testnet`` does; a batch starts once the one before it holds every
running node's capability record (the network it joined has taken it in: a hundred daemons
joining faster than two cores take them in drop each other's connections for want of CPU,
and the dropping feeds itself). It then waits until every node holds every node's
capability record and lets them settle (``SETTLE_S``), then:

* snapshots every daemon's gossip counter (``gossip_received`` in ``/status``: message copies
  peers pushed to it, duplicates included, node/p2p/gossip.py), its ready peers and their
  measured round trips (the topology the simulator is given), the peers its membership
  machine dropped so far (``dropped`` in ``/status``, each with its reason) and the CPU time
  it has used (``/proc``);
* changes the capability record (``POST /ledger/capability``, new tags) of ``updates`` nodes,
  ``UPDATE_GAP_S`` apart, waits until every node stores every new version, and reads each
  node's arrival time of each (``last_seen_ms``, on this machine's one clock) minus the
  signing time: a version's convergence is its latest arrival;
* snapshots the counters again at the end of the window, and every daemon's resident memory.

Every wait is bounded (scaled with ``nodes``) and raises TestnetError naming what it waited
for, and polls every ``POLL_S``: each poll asks every daemon over HTTP, so polling faster
would load the cores the daemons share with the measurement. Everything the simulator needs
is returned in :class:`Measured`.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from node.api.token import read_token
from node.testnet import LocalTestnet, NodeProcess, TestnetError

#: ledger timings of the bench's daemons: a change is signed at once (no coalescing beyond
#: 200 ms), and no record is re-signed by its refresh timer during a run, so the gossip in the
#: window is the updates' alone
CONFIG: dict[str, Any] = {
    "ledger": {"min_republish_ms": 200, "refresh_ms": 3_000_000, "record_ttl_ms": 3_600_000},
    # a hundred daemons share two cores: a Hello or a pong may take seconds to be answered
    "membership": {"hello_timeout_ms": 30_000, "unresponsive_after_ms": 60_000},
}
#: each new daemon bootstraps from this many running ones, drawn at random (seeded)
BOOTSTRAP_SPREAD = 3
SEED = 1
#: seconds between two record updates
UPDATE_GAP_S = 5.0
#: the measurement window runs at least this long from the first update (a bench's default)
WINDOW_S = 30.0
#: the daemons run this long after every record has spread before the snapshot is taken: a
#: connection's first ping is sent as it opens, while the daemons are still starting on
#: shared cores, and its round trip is no link latency; two ping intervals later it is
SETTLE_S = 10.0
#: the reported spread of the gossip hops (``gossip_hop_range_ms``) leaves out this share
#: either side
HOP_SPREAD = 0.05
#: how often the daemons' state is polled while waiting (each poll asks every daemon over HTTP)
POLL_S = 1.0
#: clock ticks per second of /proc/<pid>/stat's CPU times
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: bound on each wait, per daemon (start-up and spreading grow with the testnet)
WAIT_PER_NODE_S = 3.0
MIN_WAIT_S = 60.0


@dataclass
class Snapshot:
    at: float  #: time.monotonic() of the reading
    gossip_bytes: int
    gossip_messages: int
    peers: dict[str, float]  #: ready peer -> its measured round trip (ms; nan if none yet)
    #: why the daemon's membership dropped peers so far (reason -> count; the status keeps
    #: the last MAX_DROPPED of protocol/membership/machine.py)
    dropped: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0  #: CPU time the daemon has used (user + system, seconds)


@dataclass
class Measured:
    names: list[str]
    peer_ids: list[str]
    start_ms: list[int]  #: each daemon's transport start, from node 0's
    bootstraps: list[list[int]]  #: the nodes each daemon was given to bootstrap from
    records: list[dict[str, Any]]  #: each node's capability record (JSON) before the updates
    before: list[Snapshot]
    after: list[Snapshot]
    peers_at_ms: int  #: when the peers were counted, from node 0's transport start
    #: (node index, record JSON of the new version, offset from the first update in ms)
    updates: list[tuple[int, dict[str, Any], int]] = field(default_factory=list)
    #: per update, every other node's arrival minus the signing time (ms), by node index
    arrivals: list[dict[int, int]] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    start_s: float = 0.0  #: wall time to start every daemon


def measure(net: LocalTestnet, nodes: int, updates: int, batch: int,
            window_s: float = WINDOW_S, settle_s: float = SETTLE_S) -> Measured:
    wait_s = max(MIN_WAIT_S, WAIT_PER_NODE_S * nodes)
    started = time.monotonic()
    first = net.start("n0", timeout_s=wait_s)

    def synced(running: int) -> None:
        """Wait until the batch just started holds every running node's record (module doc)."""
        joined = list(net.nodes.values())[running - batch:running]
        net.wait_until(lambda: all(_ledger(d).get("records", 0) >= running for d in joined),
                       f"the batch up to {running} daemons to hold every record", wait_s,
                       interval_s=POLL_S)

    rest = net.start_batches([f"n{i}" for i in range(1, nodes)], batch=batch, timeout_s=wait_s,
                             spread=BOOTSTRAP_SPREAD, rng=random.Random(SEED), on_batch=synced)
    start_s = time.monotonic() - started
    daemons = [first, *rest]
    peer_ids = [d.peer_id for d in daemons]
    by_addr = {d.addresses[0]: i for i, d in enumerate(daemons)}
    net.wait_until(lambda: _all_hold(daemons, nodes), "every node to hold every record", wait_s,
                   interval_s=POLL_S)
    time.sleep(settle_s)  # a fixed settling time (see SETTLE_S), not a wait for a condition
    t0 = _log_time(first, "transport.started")
    began = time.time()
    before = [snapshot(d) for d in daemons]
    # the peers were counted while the snapshots were taken: their midpoint, from node 0's start
    peers_at_ms = round(((began + time.time()) / 2 - t0) * 1000)
    # one client for the run's thousands of requests: a new one per request builds its SSL
    # context each time, and the polls of a hundred daemons fall behind
    with httpx.Client(timeout=10.0) as http:
        measured = Measured(
            names=[d.name for d in daemons], peer_ids=peer_ids,
            start_ms=[round((_log_time(d, "transport.started") - t0) * 1000) for d in daemons],
            bootstraps=[[by_addr[a] for flag, a in zip(d.args, d.args[1:], strict=False)
                         if flag == "--bootstrap"] for d in daemons],
            records=[_record(http, d, d.peer_id) for d in daemons],
            before=before, after=[], peers_at_ms=peers_at_ms,
            start_s=start_s)
        _update(net, http, daemons, measured, updates, window_s, wait_s)
    measured.after = [snapshot(d) for d in daemons]
    measured.rss_mb = [rss_mb(d) for d in daemons]
    return measured


def _all_hold(daemons: list[NodeProcess], nodes: int) -> bool:
    return all(_ledger(d).get("records", 0) >= nodes for d in daemons)


def _ledger(daemon: NodeProcess) -> dict[str, Any]:
    result: dict[str, Any] = daemon.status()["services"]["ledger"]
    return result


def snapshot(daemon: NodeProcess) -> Snapshot:
    status = daemon.status()
    gossip = status.get("gossip_received", {})
    peers = {p["peer_id"]: float(p.get("latency_ms") or "nan")
             for p in status["peers"] if p.get("state") == "ready"}
    dropped: dict[str, int] = {}
    for drop in status.get("dropped", []):
        dropped[drop["reason"]] = dropped.get(drop["reason"], 0) + 1
    return Snapshot(at=time.monotonic(), gossip_bytes=int(gossip.get("bytes", 0)),
                    gossip_messages=int(gossip.get("messages", 0)), peers=peers,
                    dropped=dropped, cpu_s=cpu_s(daemon))


def cpu_s(daemon: NodeProcess) -> float:
    """The CPU time the daemon has used so far (utime + stime from /proc/<pid>/stat), s."""
    assert daemon.proc is not None  # started by us: our own bookkeeping
    with open(f"/proc/{daemon.proc.pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after the command name
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def rss_mb(daemon: NodeProcess) -> float:
    """The daemon's resident memory (VmRSS), MiB."""
    assert daemon.proc is not None  # started by us: our own bookkeeping
    for line in open(f"/proc/{daemon.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise TestnetError(f"no VmRSS for node {daemon.name}")


def _record(http: httpx.Client, daemon: NodeProcess, peer: str) -> dict[str, Any]:
    got = http.get(f"{daemon.api_url}/ledger/peers/{peer}")
    got.raise_for_status()
    result: dict[str, Any] = got.json()
    return result


def _log_time(daemon: NodeProcess, event: str) -> float:
    """Epoch seconds of the first ``event`` in the daemon's JSON log."""
    stamp = daemon.log_events(event)[0]["timestamp"]
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _update(net: LocalTestnet, http: httpx.Client, daemons: list[NodeProcess], measured: Measured, updates: int,
            window_s: float, wait_s: float) -> None:
    """Change ``updates`` nodes' records ``UPDATE_GAP_S`` apart; wait for every node to hold
    each new version, and the window to end; read the arrivals."""
    n = len(daemons)
    chosen = [1 + (k * (n - 1)) // updates for k in range(updates)] if n > 1 else [0]
    first_at = time.monotonic()
    for k, index in enumerate(chosen):
        time.sleep(max(0.0, first_at + k * UPDATE_GAP_S - time.monotonic()))  # the schedule
        offset_ms = round((time.monotonic() - first_at) * 1000)
        record = _post_tags(http, daemons[index], ["scale", f"update-{k}"])
        measured.updates.append((index, record, offset_ms))

    def everyone_has_them() -> bool:
        return all(_record(http, d, daemons[i].peer_id)["record"]["seq"] >= rec["seq"]
                   for i, rec, _ in measured.updates for d in daemons)

    net.wait_until(everyone_has_them, "every node to store every update", wait_s,
                   interval_s=POLL_S)
    time.sleep(max(0.0, first_at + window_s - time.monotonic()))  # the window's fixed length
    for i, rec, _ in measured.updates:
        arrivals = {}
        for j, d in enumerate(daemons):
            if j != i:
                shown = _record(http, d, daemons[i].peer_id)
                if shown["record"]["seq"] != rec["seq"]:
                    raise TestnetError(f"node {d.name} moved past update seq {rec['seq']}")
                arrivals[j] = int(shown["last_seen_ms"]) - int(rec["issued_at_ms"])
        measured.arrivals.append(arrivals)


def _post_tags(http: httpx.Client, daemon: NodeProcess, tags: list[str]) -> dict[str, Any]:
    response = http.post(daemon.api_url + "/ledger/capability", json={"tags": tags},
                         headers={"Authorization": f"Bearer {read_token(daemon.data_dir)}"})
    response.raise_for_status()
    record: dict[str, Any] = response.json()["record"]
    return record


def gossip_bytes_per_node_min(measured: Measured) -> float:
    """Mean over daemons of gossip message bytes received per minute over the window."""
    rates = [(b.gossip_bytes - a.gossip_bytes) / ((b.at - a.at) / 60.0)
             for a, b in zip(measured.before, measured.after, strict=True)]
    return statistics.fmean(rates)


def gossip_hops(measured: Measured) -> list[tuple[int, int, int]]:
    """The gossip hops between the daemons, measured on the updates, as (ms, from, to): for
    each update and each node but its updater, the node's arrival minus the earliest arrival
    among its direct peers (the updater's counted as its signing): the last hop of the way the
    version actually came, from a neighbour holding it to this node holding it. Each holds all
    a hop cost these daemons: the link, the forwarding, framing, signature check and store,
    and the waits for cores shared with every other daemon."""
    index = {peer: i for i, peer in enumerate(measured.peer_ids)}
    neighbours = [{index[p] for p in snap.peers if p in index} for snap in measured.before]
    hops = []
    for (origin, _, _), arrivals in zip(measured.updates, measured.arrivals, strict=True):
        held = {**arrivals, origin: 0}
        for j, at in arrivals.items():
            earlier = [(held[k], k) for k in neighbours[j] if k in held and held[k] <= at]
            if earlier:
                first, k = min(earlier)
                hops.append((at - first, k, j))
    if not hops:
        raise TestnetError("no update reached a node from a direct peer: no gossip hop")
    return hops


def gossip_hops_ms(measured: Measured) -> list[int]:
    """The times of the gossip hops (ms, :func:`gossip_hops`), sorted."""
    return sorted(ms for ms, _, _ in gossip_hops(measured))


def processing_ms(measured: Measured, link_ms: Callable[[int, int], float]) -> list[float]:
    """What each gossip hop (:func:`gossip_hops`) took beyond its link's one-way latency
    (``link_ms(i, j)``, never below 0): the receiving daemon's own processing of the version,
    waits for a core included; the simulator draws each node's processing delay from these
    (simulations/workloads/testnet.py). Sorted."""
    return sorted(max(0.0, ms - link_ms(k, j)) for ms, k, j in gossip_hops(measured))


def gossip_hop_ms(measured: Measured) -> float:
    """The median gossip hop (ms, :func:`gossip_hops_ms`)."""
    return float(statistics.median(gossip_hops_ms(measured)))


def gossip_hop_range_ms(measured: Measured) -> tuple[float, float]:
    """The spread of the gossip hops (ms, :func:`gossip_hops_ms`): from the ``HOP_SPREAD``
    quantile to the ``1 - HOP_SPREAD`` one, leaving out a few stragglers either side."""
    hops = gossip_hops_ms(measured)
    last = len(hops) - 1
    return float(hops[round(HOP_SPREAD * last)]), float(hops[round((1 - HOP_SPREAD) * last)])


def daemon_cores(measured: Measured) -> float:
    """How many cores the daemons used together over the window (their CPU seconds over the
    window's wall seconds): near the machine's core count, they were short of CPU."""
    used = sum(b.cpu_s - a.cpu_s for a, b in zip(measured.before, measured.after, strict=True))
    return used / (window_ms(measured) / 1000)


def window_ms(measured: Measured) -> int:
    """The mean length of the daemons' windows (each from its first to its last reading)."""
    return round(statistics.fmean(b.at - a.at for a, b in
                                  zip(measured.before, measured.after, strict=True)) * 1000)
