"""Core messages: handshake, liveness and peer exchange.

Tag ranges, so that machines in separate modules never collide:
1-19 core (this module), 20-39 ledger, 40-69 task market, 70-89 verification,
90-109 weight relay, 110-129 rollout jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from protocol.codec import Message, limits, message

MAX_ADDRS = 8
MAX_ADDR_LEN = 256
MAX_PEER_ID_LEN = 64
#: peers per PeerList reply
MAX_EXCHANGED_PEERS = 32


@message(1)
@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Message):
    """First message on a new connection, both ways. A node on another network is refused."""
    repeatable: ClassVar[bool] = True

    network_id: str = limits(max_len=32)
    protocol_version: int = limits(lo=0, hi=1 << 16)
    agent_version: str = limits(max_len=64)
    listen_addrs: tuple[str, ...] = limits(max_items=MAX_ADDRS, max_len=MAX_ADDR_LEN)


@message(2)
@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    nonce: int = limits(lo=0, hi=(1 << 63) - 1)


@message(3)
@dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Message):
    nonce: int = limits(lo=0, hi=(1 << 63) - 1)


@message(4)
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerListRequest(Message):
    """Ask a peer which other peers it knows (peer exchange)."""
    repeatable: ClassVar[bool] = True

    max_peers: int = limits(lo=1, hi=MAX_EXCHANGED_PEERS)


@message(5)
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerInfo(Message):
    peer_id: str = limits(max_len=MAX_PEER_ID_LEN)
    addrs: tuple[str, ...] = limits(max_items=MAX_ADDRS, max_len=MAX_ADDR_LEN)


@message(6)
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerList(Message):
    """The answer to a PeerListRequest: while a node's peers stay the same it is the same bytes
    every exchange round, so it is no replay (counted as one, it got honest peers banned)."""
    repeatable: ClassVar[bool] = True

    peers: tuple[PeerInfo, ...] = limits(max_items=MAX_EXCHANGED_PEERS)
