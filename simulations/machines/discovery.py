"""Hosting protocol.membership.discovery on virtual nodes: signed rendezvous records.

* ``build`` makes the machine from the node's identity and rng and tells it the node's address
  for its own record, as the daemon's discovery service does at start. Machines see Unix-epoch
  time already (the swarm's ``machine_now_ms``), so the clock offset is 0.
* ``Discovered`` is performed as the daemon performs it: the peer goes to the node's
  membership machine as a known peer (``AddKnown``), which dials it while below its target.
"""

from __future__ import annotations

from protocol.membership.discovery import Discovered, Discovery, DiscoveryConfig, SetRecordAddrs
from protocol.membership.discovery_messages import DiscoverRequest, DiscoverResponse, Register
from protocol.membership.machine import AddKnown
from simulations.machines.membership import NAME as MEMBERSHIP
from simulations.node import MachineSpec, VirtualNode

NAME = "discovery"
MESSAGE_TYPES = (Register, DiscoverRequest, DiscoverResponse)


def discovery_spec(config: DiscoveryConfig) -> MachineSpec:
    def build(node: VirtualNode) -> Discovery:
        machine = Discovery(config=config, identity=node.identity, rng=node.rng)
        # a new machine has no peers: telling it its address yields no effects
        machine.handle(SetRecordAddrs((node.addr,)), node.swarm.machine_now_ms)
        return machine

    def discovered(node: VirtualNode, _name: str, effect: Discovered) -> None:
        node.submit(MEMBERSHIP, AddKnown(effect.addrs))

    return MachineSpec(name=NAME, build=build, message_types=MESSAGE_TYPES,
                       performers={Discovered: discovered})


def discovery_of(node: VirtualNode) -> Discovery:
    machine = node.machine(NAME)
    if not isinstance(machine, Discovery):
        raise TypeError(f"node {node.index} hosts no discovery machine")
    return machine
