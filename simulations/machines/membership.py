"""Hosting protocol.membership.machine on virtual nodes: Hello, ping, peer exchange, dialling.

* ``build`` makes the machine from the node's peer id and rng and tells it the node's listen
  address, as the daemon's membership service does at start (the machine keeps nothing across
  a restart: the address book is rebuilt from the bootstrap peers and peer exchange).
* The machine's effects are all common ones (``Send``, ``Dial``, ``Disconnect``, ``Emit``):
  the transport performs them; ``bootstrap`` is the daemon's ``bootstrap`` config key.
"""

from __future__ import annotations

from protocol.membership.machine import AddBootstrap, Membership, MembershipConfig, SetListenAddrs
from protocol.membership.messages import Hello, PeerList, PeerListRequest, Ping, Pong
from simulations.node import MachineSpec, VirtualNode

NAME = "membership"
MESSAGE_TYPES = (Hello, Ping, Pong, PeerListRequest, PeerList)


def membership_spec(config: MembershipConfig) -> MachineSpec:
    def build(node: VirtualNode) -> Membership:
        machine = Membership(config=config, self_peer=node.peer_id, rng=node.rng)
        # a new machine has no peers: telling it its address yields no effects
        machine.handle(SetListenAddrs((node.addr,)), node.swarm.machine_now_ms)
        return machine

    return MachineSpec(name=NAME, build=build, message_types=MESSAGE_TYPES)


def bootstrap(node: VirtualNode, peers: list[VirtualNode]) -> None:
    """Tell a node's membership machine its bootstrap peers (it dials them itself)."""
    node.submit(NAME, AddBootstrap(tuple(p.addr for p in peers if p is not node)))


def membership_of(node: VirtualNode) -> Membership:
    machine = node.machine(NAME)
    if not isinstance(machine, Membership):
        raise TypeError(f"node {node.index} hosts no membership machine")
    return machine
