"""AutoNAT (v1): learning whether this node is publicly reachable, by asking peers to dial us
back, and dialling back peers who ask us.

Spec: libp2p/specs autonat/autonat-v1.md; wire: py-libp2p 0.8.1's generated
``autonat_pb2.Message`` (the spec's schema), one varint-delimited message each way.

Server (:class:`AutoNatServer`): a ``DIAL`` is answered by a fresh TCP connection to the
asker, secured with Noise as far as proving its peer id, then closed: never over the
connection we already share, which would prove nothing. Only the IP address the request
came from is dialled (the spec's rule against using us to attack a third party): the
asker's addresses on that IP, and that IP with each port it offered (a node listening on
``0.0.0.0`` behind a forwarded port does not know its public address). At most
``MAX_DIALBACK_ADDRS`` dials, ``dialback_timeout_s`` each, ``max_concurrent_dialbacks`` at
once (more are refused ``E_DIAL_REFUSED``), ``dialback_requests_per_peer_per_min`` per peer
(more are refused and penalized as a flood). A request over a relayed connection is refused.
A message that is not a ``DIAL`` is answered ``E_BAD_REQUEST`` and penalized.

Client (:func:`probe` and :class:`Reachability`): "public" once the majority of the last
``VERDICT_WINDOW`` answers (one per peer) is ``OK``, "private" once it is ``E_DIAL_ERROR``,
"unknown" before any answer or on a tie. A peer that lies moves one vote of several.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import multiaddr
import structlog
import trio
from libp2p.custom_types import TProtocol
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID

from node.p2p.circuit_hop import is_relayed, peer_of
from node.p2p.framing import PeerFault
from node.p2p.multiaddrs import direct_tcp_endpoints
from node.p2p.natconfig import NatConfig
from node.p2p.pbwire import close_quietly, read_message, write_message
from protocol.buckets import KeyedBuckets

AUTONAT_ID = TProtocol("/libp2p/autonat/1.0.0")
#: dial-backs made for one request at most
MAX_DIALBACK_ADDRS = 4
#: addresses of a request looked at (the rest are ignored)
MAX_OFFERED_ADDRS = 16
#: answers the verdict is made of (the latest from each peer)
VERDICT_WINDOW = 5
PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"


def dialback_candidates(offered: list[bytes], observed_ip: str) -> list[str]:
    """What a server may dial for a request from ``observed_ip``; see the module doc."""
    try:
        observed = ipaddress.ip_address(observed_ip)
    except ValueError:
        return []
    family = "ip4" if observed.version == 4 else "ip6"
    out: list[str] = []
    for endpoint in direct_tcp_endpoints(offered[:MAX_OFFERED_ADDRS]):
        candidate = f"/{family}/{observed}/tcp/{endpoint.port}"  # its IP is the observed one
        if candidate not in out:
            out.append(candidate)
    return out[:MAX_DIALBACK_ADDRS]


def _response(status: int, text: str = "", addr: bytes = b"") -> Message:
    message = Message(type=Message.DIAL_RESPONSE)
    message.dialResponse.status = status
    if text:
        message.dialResponse.statusText = text
    if addr:
        message.dialResponse.addr = addr
    return message


class AutoNatServer:
    """Answers other peers' dial-back requests; see the module doc."""

    def __init__(self, host: Any, config: NatConfig, read_deadline_s: float,
                 now_ms: Callable[[], int]) -> None:
        self._host = host
        self._swarm = host.get_network()
        self._config = config
        self._deadline_s = read_deadline_s
        self._now_ms = now_ms
        per_min = config.dialback_requests_per_peer_per_min
        self._budget = KeyedBuckets(per_min / 60, per_min)
        self._dialing = trio.CapacityLimiter(config.max_concurrent_dialbacks)
        self.answered: dict[str, int] = {}
        self._log = structlog.get_logger(__name__)

    async def handle(self, stream: Any) -> None:
        peer = peer_of(stream)
        with trio.fail_after(self._deadline_s):
            message = await read_message(stream, Message)
        answer, fault = await self._answer(stream, peer, message)
        name = Message.ResponseStatus.Name(answer.dialResponse.status)
        self.answered[name] = self.answered.get(name, 0) + 1
        with trio.fail_after(self._deadline_s):
            await write_message(stream, answer)
        if fault is not None:
            raise fault

    async def _answer(self, stream: Any, peer: str,
                      message: Message) -> tuple[Message, PeerFault | None]:
        if not self._budget.take(peer, self._now_ms()):
            return (_response(Message.E_DIAL_REFUSED, "too many requests"),
                    PeerFault("flood", "AutoNAT requests over the per-minute limit"))
        if message.type != Message.DIAL or not message.HasField("dial"):
            return (_response(Message.E_BAD_REQUEST, "expected DIAL"),
                    PeerFault("invalid", "an AutoNAT message that is no DIAL"))
        if message.dial.peer.id and message.dial.peer.id != ID.from_base58(peer).to_bytes():
            return (_response(Message.E_BAD_REQUEST, "peer id is not the asker's"),
                    PeerFault("invalid", "a DIAL for another peer id"))
        if is_relayed(stream.muxed_conn):
            return _response(Message.E_DIAL_REFUSED, "relayed connection"), None
        remote = stream.muxed_conn.get_remote_address()
        candidates = dialback_candidates([bytes(a) for a in message.dial.peer.addrs],
                                         remote[0] if remote else "")
        if not candidates:
            return _response(Message.E_DIAL_REFUSED, "no address on the observed IP"), None
        try:
            self._dialing.acquire_nowait()
        except trio.WouldBlock:
            return _response(Message.E_DIAL_REFUSED, "busy"), None
        try:
            for candidate in candidates:
                if await self._dial_back(candidate, peer):
                    return _response(Message.OK, addr=multiaddr.Multiaddr(
                        candidate).to_bytes()), None
        finally:
            self._dialing.release()
        return _response(Message.E_DIAL_ERROR, "dial-back failed"), None

    async def _dial_back(self, addr: str, peer: str) -> bool:
        """A fresh connection to ``addr`` whose Noise handshake proves ``peer``; closed."""
        maddr = multiaddr.Multiaddr(addr)
        transport = self._swarm.transport_manager.transport_for_dialing(maddr)
        raw = None
        with trio.move_on_after(self._config.dialback_timeout_s):
            try:
                raw = await transport.dial(maddr)
                peer_id = ID.from_base58(peer)
                secured = await self._swarm.upgrader.upgrade_security(raw, True, peer_id)
                # multiplexed too, as any connection: a peer seeing a bare handshake and a
                # close would log a failed connection
                muxed = await self._swarm.upgrader.upgrade_connection(secured, peer_id)
                await muxed.close()
                return True
            except Exception as exc:
                self._log.debug("autonat.dialback_failed", addr=addr, error=repr(exc)[:200])
            finally:
                if raw is not None:
                    with trio.CancelScope(shield=True):
                        try:
                            await raw.close()
                        except Exception:
                            pass  # closed already
        return False


async def probe(host: Any, server: str, addrs: list[str], deadline_s: float) -> str | None:
    """Ask ``server`` to dial ``addrs`` back: PUBLIC, PRIVATE, or None (no verdict)."""
    request = Message(type=Message.DIAL)
    request.dial.peer.id = host.get_id().to_bytes()
    request.dial.peer.addrs.extend(multiaddr.Multiaddr(a).to_bytes()
                                   for a in addrs[:MAX_OFFERED_ADDRS])
    stream = await host.new_stream(ID.from_base58(server), [AUTONAT_ID])
    try:
        with trio.fail_after(deadline_s):
            await write_message(stream, request)
            answer = await read_message(stream, Message)
    finally:
        await close_quietly(stream)
    if answer.type != Message.DIAL_RESPONSE:
        return None
    if answer.dialResponse.status == Message.OK:
        return PUBLIC
    if answer.dialResponse.status == Message.E_DIAL_ERROR:
        return PRIVATE
    return None


class Reachability:
    """The verdict from the latest answer of each of the last ``VERDICT_WINDOW`` peers."""

    def __init__(self) -> None:
        self._answers: OrderedDict[str, str] = OrderedDict()

    def record(self, peer: str, verdict: str) -> None:
        self._answers.pop(peer, None)
        self._answers[peer] = verdict
        while len(self._answers) > VERDICT_WINDOW:
            self._answers.popitem(last=False)

    @property
    def status(self) -> str:
        public = sum(v == PUBLIC for v in self._answers.values())
        private = len(self._answers) - public
        if public > private:
            return PUBLIC
        if private > public:
            return PRIVATE
        return UNKNOWN

    def answers(self) -> dict[str, str]:
        return dict(self._answers)
