"""simulations/workloads/testnet.py: the simulator's predictions for a testnet of daemons.

A small testnet described by hand (what ``bench scale`` measures from daemons) goes through
``predict``; the checks are what the protocol and the given links imply: peers found by the
membership machine, gossip copies of the mesh, convergence that follows link latency.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from protocol.codec import encode
from protocol.ledger.machine import CapabilitySpec, LedgerConfig
from protocol.ledger.records import HardwareSummary, Role
from protocol.membership.discovery import DiscoveryConfig
from protocol.membership.machine import MembershipConfig
from simulations.workloads.testnet import (
    DaemonNet,
    Update,
    expected_convergence_s,
    predict,
    predict_ledger,
)

N = 5
LATENCY_MS = 3.0


def _spec(i: int, tags: tuple[str, ...] = ()) -> CapabilitySpec:
    return CapabilitySpec(
        listen_addrs=(f"/ip4/127.0.0.1/tcp/{40000 + i}",), models=(),
        hardware=HardwareSummary(device_kind="cpu", device_name="x", memory_bytes=1 << 30,
                                 cpu_cores=2),
        price_per_1k_tokens=0.0, free_slots=0, max_slots=0, load=0.0, roles=(Role.RELAY,),
        tags=tags)


def _testnet(latency_ms: float = LATENCY_MS) -> DaemonNet:
    edges = tuple(itertools.combinations(range(N), 2))  # every pair connected
    return DaemonNet(
        start_ms=(0,) + (1000,) * (N - 1),
        bootstraps=((),) + ((0,),) * (N - 1),
        specs=tuple(_spec(i) for i in range(N)),
        edges=edges,
        latency_ms=dict.fromkeys(edges, latency_ms),
        updates=(Update(at_ms=0, node=1, spec=_spec(1, ("update-0",))),
                 Update(at_ms=5000, node=3, spec=_spec(3, ("update-1",)))),
        window_ms=20_000,
        peers_at_ms=40_000,
        membership=MembershipConfig(network_id="sim", agent_version="test"),
        discovery=DiscoveryConfig(network_id="sim"),
        ledger=LedgerConfig(min_republish_ms=200, refresh_ms=3_000_000,
                            record_ttl_ms=3_600_000),
    )


def test_every_node_of_a_small_testnet_finds_every_other() -> None:
    # node 0 is everyone's bootstrap; peer exchange introduces the others (target 8 > N-1)
    assert predict(_testnet())["peers_per_node"] == N - 1


def test_gossip_bytes_are_the_meshes_copies_of_the_updates() -> None:
    got = predict_ledger(_testnet())
    # every node holds a mesh of all N-1 others (degree 6 > N-1): the updater sends N-1
    # copies, each other node forwards to its mesh but the sender: N-1 + (N-1)(N-2) copies
    copies_per_update = (N - 1) + (N - 1) * (N - 2)
    size = got["gossip_message_bytes"]
    assert size > len(encode(_spec(1, ("update-0",)).hardware))  # a whole record, signed
    per_min = 2 * copies_per_update * size / N / (20_000 / 60_000)
    assert got["gossip_bytes_per_node_min"] == pytest.approx(per_min, rel=0.02)


def test_convergence_follows_the_links_latency() -> None:
    fast = predict_ledger(_testnet(LATENCY_MS))["converged_s"]
    slow = predict_ledger(_testnet(4 * LATENCY_MS))["converged_s"]
    # complete graph: one hop of one link's latency (plus jitter-free framing time)
    assert fast == pytest.approx(LATENCY_MS / 1000, rel=0.2)
    assert slow == pytest.approx(4 * fast, rel=0.2)


def test_an_update_never_seen_by_some_node_is_no_convergence() -> None:
    cut = replace(_testnet(), edges=((0, 1), (1, 2), (2, 3)))  # node 4 has no link
    assert predict_ledger(cut)["converged_s"] == -1.0


def test_a_nodes_processing_delay_makes_it_late_not_the_nodes_behind_it() -> None:
    # a line of 5 nodes: the update from node 1 needs 3 links of 3 ms to reach node 4; every
    # node's measured hop of 40 ms delays its own store only (gossipsub forwards first)
    line = replace(_testnet(), edges=((0, 1), (1, 2), (2, 3), (3, 4)), processing_ms=(40.0,))
    assert predict_ledger(line)["converged_s"] == pytest.approx((3 * LATENCY_MS + 40) / 1000,
                                                                rel=0.1)
    # no hops measured: a node stores what it receives at once
    bare = predict_ledger(replace(line, processing_ms=()))["converged_s"]
    assert bare == pytest.approx(3 * LATENCY_MS / 1000, rel=0.2)


def test_processing_delays_are_drawn_from_the_measured_hops() -> None:
    line = replace(_testnet(), edges=((0, 1), (1, 2), (2, 3), (3, 4)))
    spread = predict_ledger(replace(line, processing_ms=(10.0, 200.0)))["converged_s"]
    # the last node is as late as the links and its own draw, one of the two hops
    assert (3 * LATENCY_MS + 10) / 1000 <= spread <= (3 * LATENCY_MS + 200) / 1000 + 0.001
    # seeded: the same testnet gives the same prediction
    assert predict_ledger(replace(line, processing_ms=(10.0, 200.0)))["converged_s"] == spread


def test_convergence_is_the_expected_last_store_over_the_delay_draws() -> None:
    # three nodes reach an update 5 ms after its updater signs it, each then takes 10 or 200
    # ms: the last store comes 5 + 200 ms after, unless all three drew 10 (one time in 8)
    reached = [(0, {0: 0.0, 1: 5.0, 2: 5.0, 3: 5.0})]
    expected_ms = 5 + 200 - (200 - 10) / 8
    got = expected_convergence_s(reached, (10.0, 200.0), seed=1) * 1000
    assert got == pytest.approx(expected_ms, abs=15)  # the mean of DELAY_DRAWS draws
    assert got != 205.0 and got != 15.0  # not one draw
    # no delays measured: the arrivals alone; the median over updates
    later = (1, {0: 9.0, 1: 1.0, 2: 3.0, 3: 4.0})
    assert expected_convergence_s([*reached, later, later], (), seed=1) == 0.008


def test_peers_dropped_are_the_membership_machines_drops() -> None:
    # links slower one way than the Hello timeout: every connection is dropped by the
    # machine's own rule ("no hello within the timeout"), as a daemon's would be, and counted
    slow = replace(_testnet(latency_ms=4000.0),
                   membership=MembershipConfig(network_id="sim", agent_version="test",
                                               hello_timeout_ms=3000))
    got = predict(slow)
    assert got["peers_per_node"] < N - 1
    assert got["peers_dropped"] >= 1
    assert predict(_testnet())["peers_dropped"] == 0
