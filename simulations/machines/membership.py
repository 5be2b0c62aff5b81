"""Hosting protocol.membership.machine on virtual nodes: Hello, ping, peer exchange, dialling."""

from __future__ import annotations

from protocol.membership.machine import AddBootstrap, Membership, MembershipConfig, SetListenAddrs
from protocol.membership.messages import Hello, PeerList, PeerListRequest, Ping, Pong
from simulations.node import MachineSpec, VirtualNode

NAME = "membership"
MESSAGE_TYPES = (Hello, Ping, Pong, PeerListRequest, PeerList)


def membership_spec(config: MembershipConfig) -> MachineSpec:
    def build(node: VirtualNode) -> Membership:
        machine = Membership(config=config, self_peer=node.peer_id, rng=node.rng)
        machine.handle(SetListenAddrs((node.addr,)), node.swarm.now_ms)
        return machine

    return MachineSpec(name=NAME, build=build, message_types=MESSAGE_TYPES)


def bootstrap(node: VirtualNode, peers: list[VirtualNode]) -> None:
    """Tell a node's membership machine its bootstrap peers (it dials them itself)."""
    node.submit(NAME, AddBootstrap(tuple(p.addr for p in peers if p is not node)))
