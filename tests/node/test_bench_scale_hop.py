"""``bench scale``'s gossip hop (node/bench/scale/daemons.py gossip_hop_ms): read off the
arrivals of the updates, each node's arrival minus its first neighbour's. No daemon starts."""

from __future__ import annotations

import pytest

from node.bench.scale.daemons import (
    Measured,
    Snapshot,
    gossip_hop_ms,
    gossip_hop_range_ms,
    processing_ms,
)
from node.testnet import TestnetError as ScaleWaitError


def _measured(edges: list[tuple[int, int]], n: int,
              arrivals: list[tuple[int, dict[int, int]]]) -> Measured:
    peers = [f"p{i}" for i in range(n)]
    links: list[dict[str, float]] = [{} for _ in range(n)]
    for i, j in edges:
        links[i][peers[j]] = links[j][peers[i]] = 1.0
    snaps = [Snapshot(at=0.0, gossip_bytes=0, gossip_messages=0, peers=p) for p in links]
    return Measured(names=peers, peer_ids=peers, start_ms=[0] * n, bootstraps=[[]] * n,
                    records=[], before=snaps, after=snaps, peers_at_ms=0,
                    updates=[(origin, {}, 0) for origin, _ in arrivals],
                    arrivals=[a for _, a in arrivals])


def test_a_hop_is_a_nodes_arrival_after_its_first_neighbours() -> None:
    # a line 0-1-2-3 from node 0: hops of 10, 30 and 20 ms
    line = _measured([(0, 1), (1, 2), (2, 3)], 4, [(0, {1: 10, 2: 40, 3: 60})])
    assert gossip_hop_ms(line) == 20.0
    # a triangle and a tail: node 2 hears from the updater (5 ms), not through node 1
    tri = _measured([(0, 1), (0, 2), (1, 2), (2, 3)], 4, [(0, {1: 50, 2: 5, 3: 25})])
    assert gossip_hop_ms(tri) == 20.0  # median of 50, 5 and 20


def test_hops_are_pooled_over_the_updates() -> None:
    two = _measured([(0, 1), (1, 2)], 3, [(0, {1: 10, 2: 20}), (2, {1: 40, 0: 100})])
    assert gossip_hop_ms(two) == 25.0  # median of 10, 10, 40 and 60


def test_no_update_reaching_a_neighbour_is_an_error() -> None:
    with pytest.raises(ScaleWaitError, match="no gossip hop"):
        gossip_hop_ms(_measured([], 2, [(0, {1: 10})]))


def test_the_hop_range_leaves_out_the_stragglers() -> None:
    # a star from node 0: 21 hops of 10..30 ms, and one node 2 s late
    arrivals = {i: 9 + i for i in range(1, 22)} | {22: 2000}
    star = _measured([(0, i) for i in range(1, 23)], 23, [(0, arrivals)])
    assert gossip_hop_range_ms(star) == (11.0, 30.0)


def test_processing_is_a_hop_less_the_latency_of_the_link_it_came_over() -> None:
    # the triangle and tail again: node 1 from the updater (50), node 2 from the updater (5),
    # node 3 from node 2 (20); links to the updater take 4 ms, the others 30 ms
    tri = _measured([(0, 1), (0, 2), (1, 2), (2, 3)], 4, [(0, {1: 50, 2: 5, 3: 25})])
    got = processing_ms(tri, lambda i, j: 4.0 if 0 in (i, j) else 30.0)
    assert got == [0.0, 1.0, 46.0]  # 20 - 30 is no processing: never below 0
