"""Rendezvous discovery on the simulator, with the real machines: nodes that each know only
the node before them (a chain) find the whole network through signed records, where without
discovery (and with peer exchange off) each keeps only its chain neighbours."""

from __future__ import annotations

import pytest

from protocol.membership.discovery import DiscoveryConfig
from protocol.membership.machine import ConnState, MembershipConfig
from simulations.machines.discovery import discovery_of, discovery_spec
from simulations.machines.membership import bootstrap, membership_of, membership_spec
from simulations.runner.world import build_swarm
from simulations.scenario import parse

NODES = 40
TARGET = 6
NET = "simnet"


def _degrees_after(seed: int, *, discovery: bool, run_s: int = 60) -> list[int]:
    scenario = parse({"kind": "membership", "seed": seed, "nodes": NODES,
                      "network": {"latency": {"kind": "lognormal", "a": 40.0, "b": 0.5,
                                              "jitter_ms": 5.0}}}, "chain", "chain")
    specs = (membership_spec(MembershipConfig(network_id=NET, agent_version="sim/1",
                                              target_peers=TARGET, peer_exchange=False)),
             discovery_spec(DiscoveryConfig(network_id=NET, enabled=discovery)))
    swarm = build_swarm(scenario, NODES, seed, lambda i: specs, connect=False, start=False)
    for node in swarm.nodes:
        swarm.start(node)
    for prev, node in zip(swarm.nodes, swarm.nodes[1:], strict=False):
        bootstrap(node, [prev])  # each node is told of the one before it, and nothing else
    swarm.run(run_s * 1000)
    if discovery:
        assert all(sum(discovery_of(n).relayed_by.values()) <= len(discovery_of(n).table)
                   for n in swarm.nodes)
    return [sum(1 for c in membership_of(n).conns.values() if c.state is ConnState.READY)
            for n in swarm.nodes]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_chain_of_nodes_finds_the_whole_network_through_records(seed: int) -> None:
    degrees = _degrees_after(seed, discovery=True)
    assert min(degrees) >= TARGET, f"seed {seed}: {degrees}"


def test_without_discovery_the_chain_stays_a_chain() -> None:
    assert max(_degrees_after(1, discovery=False, run_s=20)) <= 2
