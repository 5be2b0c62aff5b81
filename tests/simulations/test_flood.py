"""Planned gossip floods: shortest arrival times, and re-plans when the network moves mid-flood."""

from __future__ import annotations

import heapq
import random

import numpy as np
import pytest

from simulations.network import LatencyModel, LinkFaults
from simulations.swarm import Swarm
from simulations.wire.flood import NEVER, shortest_arrivals
from tests.simulations.tiny import SPEC, Shout

HOP_MS = 10


def _dijkstra(rows: np.ndarray, weights: np.ndarray, source: int, start: int) -> list[int]:
    best = [NEVER] * len(rows)
    best[source] = start
    queue = [(start, source)]
    while queue:
        t, a = heapq.heappop(queue)
        if t > best[a]:
            continue
        for b, w in zip(rows[a].tolist(), weights[a].tolist(), strict=True):
            if b >= 0 and w < NEVER and t + w < best[b]:
                best[b] = t + w
                heapq.heappush(queue, (t + w, b))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_planned_arrivals_are_the_shortest_paths(seed: int) -> None:
    rng = random.Random(seed)
    n, width = 60, 6
    rows = np.full((n, width), -1, np.int32)
    weights = np.full((n, width), NEVER, np.int64)
    for a in range(n):
        peers = rng.sample([b for b in range(n) if b != a], rng.randrange(width + 1))
        rows[a, : len(peers)] = peers
        for j in range(len(peers)):
            # small integer times: many ties between copies
            weights[a, j] = NEVER if rng.random() < 0.1 else rng.randrange(1, 8)
    arrival = np.full(n, NEVER, np.int64)
    parent = np.full(n, -1, np.int32)
    arrival[0] = 1000
    shortest_arrivals(arrival, parent, rows, weights, np.array([0]))
    assert arrival.tolist() == _dijkstra(rows, weights, 0, 1000)
    for b in range(1, n):
        if arrival[b] < NEVER:  # the lowest-numbered sender whose copy arrived first
            firsts = [
                a
                for a in range(n)
                if arrival[a] < NEVER
                for j in np.flatnonzero(rows[a] == b)
                if arrival[a] + weights[a, j] == arrival[b]
            ]
            assert parent[b] == min(firsts)
        else:
            assert parent[b] == -1


def _line(n: int, **kwargs: object) -> tuple[Swarm, list[int]]:
    """Nodes 0-1-...-(n-1) in a line, one hop HOP_MS; returns the swarm and who heard."""
    swarm = Swarm(1, latency=LatencyModel("constant", float(HOP_MS)), **kwargs)  # type: ignore[arg-type]
    nodes = [swarm.add_node((SPEC,)) for _ in range(n)]
    for node in nodes:
        swarm.start(node)
    for a, b in zip(nodes, nodes[1:], strict=False):
        swarm.connect(a, b)
    heard: list[int] = []
    swarm.on_emit("heard", lambda node, f, now: heard.append(node.index))
    return swarm, heard


def test_a_line_hears_hop_by_hop_and_counts_every_copy() -> None:
    swarm, heard = _line(5)
    times: dict[int, int] = {}
    swarm.on_emit("heard", lambda node, f, now: times.setdefault(node.index, now))
    swarm.nodes[0].submit("tiny", Shout(1))
    swarm.run(1_000)
    assert heard == [1, 2, 3, 4]
    assert [times[i] for i in (1, 2, 3, 4)] == [HOP_MS, 2 * HOP_MS, 3 * HOP_MS, 4 * HOP_MS]
    # each node sends on to its other neighbour only: 4 copies, none duplicated
    assert sum(n.msgs_sent for n in swarm.nodes) == 4
    assert sum(n.msgs_received for n in swarm.nodes) == 4
    assert "gossip_duplicates" not in swarm.metrics.counters


def test_a_node_that_crashes_before_the_message_arrives_forwards_nothing() -> None:
    swarm, heard = _line(5)
    swarm.nodes[0].submit("tiny", Shout(1))
    swarm.at_ms(HOP_MS + 5, swarm.crash, swarm.nodes[2])
    swarm.run(1_000)
    assert heard == [1]


def test_a_node_that_joins_the_mesh_mid_flood_is_reached() -> None:
    swarm, heard = _line(4)
    late = swarm.add_node((SPEC,))
    swarm.start(late)
    swarm.nodes[0].submit("tiny", Shout(1))
    # node 3 gets it at 3 hops and forwards at once: a link made before then carries it on
    swarm.at_ms(2 * HOP_MS + 5, swarm.connect, swarm.nodes[3], late)
    swarm.run(1_000)
    assert heard == [1, 2, 3, late.index]


def test_a_copy_on_its_way_to_a_restarted_node_is_lost() -> None:
    swarm, heard = _line(3)
    swarm.nodes[0].submit("tiny", Shout(1))

    def restart_and_relink() -> None:
        swarm.restart(swarm.nodes[2])
        swarm.connect(swarm.nodes[1], swarm.nodes[2])

    # node 1 has sent its copy to node 2's old incarnation: the new one never gets it
    swarm.at_ms(HOP_MS + 5, restart_and_relink)
    swarm.run(1_000)
    assert heard == [1]


def test_a_partition_mid_flood_stops_the_copies_not_yet_sent() -> None:
    swarm, heard = _line(5)
    swarm.nodes[0].submit("tiny", Shout(1))
    swarm.partition([[0, 1, 2], [3, 4]], start_ms=HOP_MS + 5, heal_ms=500)
    swarm.run(1_000)
    assert heard == [1, 2]


def test_loss_and_duplication_are_drawn_per_copy() -> None:
    swarm = Swarm(
        3,
        latency=LatencyModel("lognormal", 20.0, 0.5, jitter_ms=4.0),
        faults=LinkFaults(loss=0.2, duplicate=0.3),
    )
    nodes = [swarm.add_node((SPEC,)) for _ in range(60)]
    for node in nodes:
        swarm.start(node)
    rng = random.Random(3)
    for node in nodes:
        swarm.connect_random(node, 4, rng)
    heard: list[int] = []
    swarm.on_emit("heard", lambda node, f, now: heard.append(node.index))
    swarm.nodes[0].submit("tiny", Shout(1))
    swarm.run(5_000)
    assert len(heard) == len(set(heard))  # never twice, whatever the network duplicates
    sent = sum(n.msgs_sent for n in nodes)
    received = sum(n.msgs_received for n in nodes)
    # some copies lost, some doubled: neither total is the other
    assert 0 < received != sent
    assert swarm.metrics.counters["gossip_duplicates"] == received - len(heard)


def test_traffic_of_a_flood_still_in_flight_is_counted_when_the_run_stops() -> None:
    swarm, heard = _line(5)
    swarm.nodes[0].submit("tiny", Shout(1))
    swarm.run(2 * HOP_MS + 1)  # nodes 1 and 2 have it; 2's copy to 3 is on its way
    assert heard == [1, 2]
    assert [n.msgs_sent for n in swarm.nodes] == [1, 1, 1, 0, 0]
    swarm.run(1_000)
    assert [n.msgs_sent for n in swarm.nodes] == [1, 1, 1, 1, 0]
    assert [n.msgs_received for n in swarm.nodes] == [0, 1, 1, 1, 1]
