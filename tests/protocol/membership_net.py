"""Peers and a membership machine for the membership tests: peer ids, their addresses, a machine
with test timings, a peer brought to READY, and the effects of one kind."""

from __future__ import annotations

import random

from crypto.keys import Identity
from protocol.machine import PeerConnected, Received
from protocol.membership.machine import Membership, MembershipConfig, SetListenAddrs
from protocol.membership.messages import Hello


def pid(n: int) -> str:
    return Identity.from_seed(bytes([n]) * 32).peer_id


ME, A, B, C = pid(1), pid(2), pid(3), pid(4)


def addr(peer: str, port: int = 4001) -> str:
    return f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}"


def hello(peer: str, network: str = "testnet", version: int = 1) -> Hello:
    return Hello(network_id=network, protocol_version=version, agent_version="t/1",
                 listen_addrs=(addr(peer),))


def machine(**overrides: int) -> Membership:
    cfg = MembershipConfig(network_id="testnet", agent_version="symphony/test", **overrides)
    m = Membership(config=cfg, self_peer=ME, rng=random.Random(7))
    m.handle(SetListenAddrs((addr(ME),)), 0)
    return m


def of(effects: list[object], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def ready(m: Membership, peer: str, now: int = 0) -> None:
    m.handle(PeerConnected(peer), now)
    m.handle(Received(peer, hello(peer)), now)
    assert m.is_ready(peer)
