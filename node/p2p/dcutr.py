"""DCUtR: upgrading a relayed connection to a direct one (hole punching over TCP).

Spec: libp2p/specs relay/DCUtR.md; wire: py-libp2p 0.8.1's generated ``dcutr_pb2.HolePunch``
(the spec's schema), varint-delimited, 4 KiB at most, ``MAX_OBS_ADDRS`` addresses looked at.

Roles, as the spec names them: the peer that received the relayed connection (the
unreachable one, which holds the reservation) is the initiator; the peer that dialled
through the relay answers. The initiator sends ``CONNECT`` with its candidate addresses (each
IP others have seen it from, with each port it listens on), the other answers ``CONNECT``
with its own, and the initiator times that round trip. Then:

1. the initiator first dials the other's addresses plainly (one of them may simply be
   public: the "unilateral" upgrade; a NAT lets an outbound connection through);
2. failing that, it sends ``SYNC`` and after half the round trip dials from its listening
   port, as the Noise responder, while the other, on ``SYNC``, dials from its listening port
   as the Noise initiator: the two SYNs cross and each NAT sees the other's SYN as the reply
   to its own (TCP simultaneous open; needs NATs that keep the source port, as Linux
   masquerading does while the port is free).

A direct connection to the peer makes py-libp2p open new streams on it rather than on the
relayed one (``Swarm._best_connection``); the relayed connection is closed
``RELAY_CLOSE_GRACE_S`` later, once streams begun on it have had time to finish. What it
assumes of peers: nothing; a message that is no ``HolePunch`` of the expected type is a
fault ("undecodable" or "invalid"), and addresses are only ever dialled, never trusted
(Noise proves the peer id on every direct connection).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import multiaddr
import structlog
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch

from node.p2p.circuit_hop import is_relayed, peer_of
from node.p2p.framing import PeerFault
from node.p2p.multiaddrs import direct_tcp_endpoints
from node.p2p.pbwire import close_quietly, read_message, read_message_or_end, write_message

DCUTR_ID = TProtocol("/libp2p/dcutr")
#: addresses of a peer's CONNECT dialled at most
MAX_OBS_ADDRS = 8
#: one dial attempt of a hole punch gives up after this long
PUNCH_DIAL_S = 3.0
#: a relayed connection is closed this long after a direct one to the same peer exists
RELAY_CLOSE_GRACE_S = 5.0


def _tcp_addrs(raw: list[bytes]) -> list[str]:
    """The direct TCP addresses of a peer's CONNECT, each as ``/ipX/<ip>/tcp/<port>``."""
    return [str(endpoint) for endpoint in direct_tcp_endpoints(raw[:MAX_OBS_ADDRS])]


class HolePuncher:
    """Both roles of DCUtR for one host; ``initiate`` for an inbound relayed connection."""

    def __init__(self, host: Any, read_deadline_s: float,
                 candidates: Callable[[], list[str]], dial_back: Callable[[], bool]) -> None:
        self._host = host
        self._swarm = host.get_network()
        self._deadline_s = read_deadline_s
        self._candidates = candidates
        self._dial_back = dial_back
        #: peer -> set when its hole punch has ended, either way (bulk streams wait on it)
        self.in_progress: dict[str, trio.Event] = {}
        #: outcomes: "unilateral", "punched", "failed"
        self.counts: Counter[str] = Counter()
        self._log = structlog.get_logger(__name__)

    def has_direct(self, peer: str) -> bool:
        conns = self._swarm.get_connections(ID.from_base58(peer))
        return any(not is_relayed(c) for c in conns)

    async def initiate(self, peer: str) -> bool:
        """Upgrade our relayed connection to ``peer`` to a direct one; True once done."""
        if self.has_direct(peer) or peer in self.in_progress:
            return self.has_direct(peer)
        done = self.in_progress[peer] = trio.Event()
        try:
            how = await self._initiate(peer)
        except Exception as exc:
            self._log.info("dcutr.failed", peer=peer, error=repr(exc)[:200])
            how = "failed"
        finally:
            done.set()
            del self.in_progress[peer]
        self.counts[how] += 1
        self._log.info("dcutr.done", peer=peer, outcome=how)
        if how != "failed":
            await trio.sleep(RELAY_CLOSE_GRACE_S)  # let streams on the relayed one finish
            await self._close_relayed(peer)
        return how != "failed"

    async def _initiate(self, peer: str) -> str:
        stream = await self._host.new_stream(ID.from_base58(peer), [DCUTR_ID])
        try:
            with trio.fail_after(self._deadline_s):
                started = trio.current_time()
                await write_message(stream, self._connect())
                answer = await read_message(stream, HolePunch)
                rtt_s = trio.current_time() - started
            if answer.type != HolePunch.CONNECT:
                raise PeerFault("invalid", "DCUtR answer that is no CONNECT")
            theirs = _tcp_addrs([bytes(a) for a in answer.ObsAddrs])
            if await self._dial_any(peer, theirs, responder=False, punch=False):
                return "unilateral"
            with trio.fail_after(self._deadline_s):
                await write_message(stream, HolePunch(type=HolePunch.SYNC))
            await trio.sleep(rtt_s / 2)  # the spec's timing: both SYNs leave together
            punched = await self._dial_any(peer, theirs, responder=True, punch=True)
            return "punched" if punched else "failed"
        finally:
            await close_quietly(stream)

    def _connect(self) -> HolePunch:
        addrs = [multiaddr.Multiaddr(a).to_bytes() for a in self._candidates()[:MAX_OBS_ADDRS]]
        return HolePunch(type=HolePunch.CONNECT, ObsAddrs=addrs)

    async def handle(self, stream: Any) -> None:
        """The answering side: CONNECT for CONNECT, then dial on SYNC."""
        peer = peer_of(stream)
        if not is_relayed(stream.muxed_conn):
            raise PeerFault("invalid", "DCUtR over a direct connection")
        with trio.fail_after(self._deadline_s):
            offer = await read_message(stream, HolePunch)
            if offer.type != HolePunch.CONNECT:
                raise PeerFault("invalid", "DCUtR opened with no CONNECT")
            await write_message(stream, self._connect())
        theirs = _tcp_addrs([bytes(a) for a in offer.ObsAddrs])
        with trio.move_on_after(self._deadline_s + PUNCH_DIAL_S * MAX_OBS_ADDRS):
            sync = await read_message_or_end(stream, HolePunch)
            if sync is None:
                return  # the initiator got through on its own: no SYNC to wait for
            if sync.type != HolePunch.SYNC:
                raise PeerFault("invalid", "DCUtR: expected SYNC")
            if self._dial_back() and not self.has_direct(peer):
                if await self._dial_any(peer, theirs, responder=False, punch=True):
                    self.counts["punched"] += 1

    def _source(self) -> tuple[str, int] | None:
        """Our listening (ip, port): hole-punch dials leave from it."""
        for endpoint in direct_tcp_endpoints(self._host.get_transport_addrs()):
            if endpoint.family == "ip4":
                return endpoint.host, endpoint.port
        return None

    async def _dial_any(self, peer: str, addrs: list[str], *, responder: bool,
                        punch: bool) -> bool:
        """Dial ``addrs`` in turn until one connects; a hole punch's dials leave from our
        listening port (``punch``), a plain dial from any port (a cancelled dial's socket
        lingers in py-libp2p 0.8.1, and one from the listening port would block the punch's
        own dial to the same address: EADDRNOTAVAIL)."""
        peer_id = ID.from_base58(peer)
        source = self._source() if punch else None
        for addr in addrs:
            if self.has_direct(peer):
                return True
            with trio.move_on_after(PUNCH_DIAL_S):
                try:
                    if responder:
                        await self._swarm.dial_addr_as_responder(
                            multiaddr.Multiaddr(addr), peer_id, source)
                    else:
                        await self._swarm.dial_addr(multiaddr.Multiaddr(addr), peer_id, source)
                    return True
                except Exception as exc:
                    self._log.debug("dcutr.dial_failed", addr=addr, responder=responder,
                                    error=repr(exc)[:200], cause=repr(exc.__cause__)[:200])
        return self.has_direct(peer)

    async def _close_relayed(self, peer: str) -> None:
        for conn in list(self._swarm.get_connections(ID.from_base58(peer))):
            if is_relayed(conn) and self.has_direct(peer):
                try:
                    await conn.close()
                except Exception:
                    pass  # closed under us
