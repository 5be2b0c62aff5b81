"""Circuit relay v2, the client's side: holding a reservation, dialling through a relay, and
accepting a relayed connection (the ``/stop`` protocol).

A relayed address names two peers: ``<relay addr>/p2p/<relay>/p2p-circuit/p2p/<target>``
(``split_circuit`` parses it; ``protocol.names.peer_id_of_multiaddr`` takes the last
``/p2p/``, the target). Once the relay has answered ``OK`` the stream through it is one more
raw connection to the target: it is secured (Noise, which checks the target's peer id) and
multiplexed (yamux) by py-libp2p's own upgrader, as a TCP socket would be, and counts as a
connection to that peer like any other (``PeerEvent`` and all). Its transport address carries
``/p2p-circuit``, so py-libp2p's stream selection prefers a direct connection to the same
peer once one exists (``Swarm._best_connection``), and ``circuit_hop.is_relayed`` tells them
apart.

What it assumes of peers: a relay answers within the read deadline with one
``HopMessage``; a ``/stop`` stream comes only from a relay we hold a live reservation with
(others are answered ``PERMISSION_DENIED`` and penalized) and names, in its ``CONNECT``, the
peer that the secured connection then proves to be (a mismatch closes it, "invalid").
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import multiaddr
import trio
from libp2p.connection_types import ConnectionType
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, Status, StopMessage

from node.p2p import multiaddrs
from node.p2p.circuit_hop import HOP_ID, peer_of
from node.p2p.framing import PeerFault
from node.p2p.multiaddrs import AddrError
from node.p2p.pbwire import read_message, write_message
from node.p2p.streams import NetBulkStream
from node.transport import TransportError

#: relay addresses of a reservation we keep at most (the relay's answer may list more)
MAX_RELAY_ADDRS = 4
STATUS_NAMES = {v: k for k, v in Status.items()}


class RelayRefused(TransportError):
    """A relay answered a request with a status other than OK."""

    def __init__(self, relay: str, what: str, status: int) -> None:
        name = STATUS_NAMES.get(status, str(status))
        super().__init__(f"relay {relay} refused {what}: {name}")
        self.status = status


@dataclass
class Held:
    """A reservation we hold: until when (unix seconds), and the relay's addresses."""

    relay: str
    expire: float
    addrs: tuple[str, ...]
    duration_s: int
    data_bytes: int


def split_circuit(addr: str) -> tuple[str, str, str]:
    """``(relay address with /p2p/<relay>, relay, target)`` of a relayed multiaddr."""
    try:
        relay_addr, relay, target = multiaddrs.split_circuit(addr)
    except AddrError as exc:
        raise TransportError(str(exc)) from None
    for peer in (relay, target):
        try:
            ID.from_base58(peer)
        except Exception as exc:
            raise TransportError(f"{peer!r} in {addr!r} is no peer id") from exc
    return relay_addr, relay, target


class _CircuitIO:
    """The relayed stream as the byte pipe py-libp2p's upgrader reads and writes: EOF as
    py-libp2p expects it, yamux window waits retried (node/p2p/streams.py)."""

    def __init__(self, stream: Any, peer: str) -> None:
        self._stream = stream
        self._bulk = NetBulkStream(stream, peer)

    async def read(self, n: int | None = None) -> bytes:
        return bytes(await self._stream.read(n))

    async def write(self, data: bytes) -> None:
        await self._bulk.write(data)

    async def close(self) -> None:
        await self._bulk.reset()

    def get_remote_address(self) -> tuple[str, int] | None:
        return None


class RelayClient:
    """Reservations we hold, dials through relays, and the ``/stop`` handler."""

    def __init__(self, host: Any, read_deadline_s: float,
                 on_inbound: Callable[[str], Awaitable[None]]) -> None:
        self._host = host
        self._swarm = host.get_network()
        self._deadline_s = read_deadline_s
        self._on_inbound = on_inbound
        self._self = host.get_id().to_base58()
        #: relay peer -> the reservation we hold with it
        self.held: dict[str, Held] = {}

    def live(self) -> list[Held]:
        now = time.time()
        return [h for h in self.held.values() if h.expire > now]

    def relayed_addrs(self) -> list[str]:
        """Our addresses through each relay we hold a live reservation with."""
        return [f"{a}/p2p-circuit/p2p/{self._self}" for held in self.live() for a in held.addrs]

    async def reserve(self, relay: str, known_addr: str | None = None) -> Held:
        """Reserve a slot on ``relay`` (connected already); RelayRefused if it declines."""
        stream = await self._hop_stream(relay)
        try:
            with trio.fail_after(self._deadline_s):
                await write_message(stream, HopMessage(type=HopMessage.RESERVE))
                answer = await read_message(stream, HopMessage)
        finally:
            await NetBulkStream(stream, relay).close()
        if answer.type != HopMessage.STATUS or answer.status != Status.OK:
            raise RelayRefused(relay, "a reservation", answer.status)
        addrs = relay_addrs(relay, [bytes(a) for a in answer.reservation.addrs], known_addr)
        if not addrs:
            raise TransportError(f"relay {relay} gave no address to be reached through")
        held = Held(relay=relay, expire=float(answer.reservation.expire), addrs=addrs,
                    duration_s=answer.limit.duration, data_bytes=answer.limit.data)
        self.held[relay] = held
        return held

    async def _hop_stream(self, relay: str) -> Any:
        try:
            with trio.fail_after(self._deadline_s):
                return await self._host.new_stream(ID.from_base58(relay), [HOP_ID])
        except Exception as exc:
            raise TransportError(f"relay {relay}: no hop stream: {exc!r}") from exc

    async def dial(self, addr: str) -> Any:
        """Connect to the target of relayed ``addr``; the connection (py-libp2p's) once up."""
        relay_addr, relay, target = split_circuit(addr)
        if target == self._self:
            raise TransportError("refusing to dial ourselves")
        if not self._swarm.get_connections(ID.from_base58(relay)):
            try:
                await self._host.connect(info_from_p2p_addr(multiaddr.Multiaddr(relay_addr)))
            except Exception as exc:
                raise TransportError(f"dial relay {relay_addr} failed: {exc!r}") from exc
        stream = await self._hop_stream(relay)
        request = HopMessage(type=HopMessage.CONNECT)
        request.peer.id = ID.from_base58(target).to_bytes()
        try:
            with trio.fail_after(self._deadline_s):
                await write_message(stream, request)
                answer = await read_message(stream, HopMessage)
            if answer.type != HopMessage.STATUS or answer.status != Status.OK:
                raise RelayRefused(relay, f"a circuit to {target}", answer.status)
            raw = RawConnection(_CircuitIO(stream, relay), True, ConnectionType.RELAYED,
                                [multiaddr.Multiaddr(addr)])
            conn = await self._swarm.upgrade_outbound_raw_conn(raw, ID.from_base58(target))
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await NetBulkStream(stream, relay).reset()
            if isinstance(exc, (TransportError, trio.Cancelled)):
                raise
            if isinstance(exc, Exception):
                raise TransportError(f"dial {addr} through the relay failed: {exc!r}") from exc
            raise
        return conn

    async def handle_stop(self, stream: Any) -> None:
        """A relay opens a circuit to us: accept it as an inbound connection."""
        relay = peer_of(stream)
        with trio.fail_after(self._deadline_s):
            message = await read_message(stream, StopMessage)
        if relay not in {h.relay for h in self.live()}:
            await self._status(stream, Status.PERMISSION_DENIED)
            raise PeerFault("invalid", "a circuit from a peer we hold no reservation with")
        if message.type != StopMessage.CONNECT:
            await self._status(stream, Status.UNEXPECTED_MESSAGE)
            raise PeerFault("invalid", f"stop message of type {message.type}")
        try:
            source = ID(message.peer.id).to_base58()
            ID.from_base58(source)
        except Exception:
            await self._status(stream, Status.MALFORMED_MESSAGE)
            raise PeerFault("invalid", "CONNECT names no valid peer id") from None
        await self._status(stream, Status.OK)
        await self._serve_circuit(stream, relay, source)

    async def _status(self, stream: Any, status: int) -> None:
        with trio.fail_after(self._deadline_s):
            await write_message(stream, StopMessage(type=StopMessage.STATUS, status=status))

    async def _serve_circuit(self, stream: Any, relay: str, source: str) -> None:
        addr = f"/p2p/{relay}/p2p-circuit/p2p/{source}"
        raw = RawConnection(_CircuitIO(stream, relay), False, ConnectionType.RELAYED,
                            [multiaddr.Multiaddr(addr)])
        muxed = await self._swarm.upgrade_inbound_raw_conn(raw, multiaddr.Multiaddr(addr))
        if muxed.peer_id.to_base58() != source:
            await muxed.close()
            raise PeerFault("invalid", f"the relay announced {source} but "
                            f"{muxed.peer_id.to_base58()} came through")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._on_inbound, source)
            await muxed.event_closed.wait()  # the circuit lives as long as this handler
            nursery.cancel_scope.cancel()


def relay_addrs(relay: str, offered: list[bytes], known_addr: str | None) -> tuple[str, ...]:
    """The relay's dialable direct addresses, each ending in ``/p2p/<relay>``."""
    out: list[str] = []
    for raw in [*offered, *([known_addr] if known_addr else [])]:
        try:
            endpoint, named = multiaddrs.direct_tcp(raw), multiaddrs.parts(raw)
        except AddrError:
            continue
        if endpoint is None or ipaddress.ip_address(endpoint.host).is_unspecified:
            continue  # not a direct TCP address anyone could dial
        text = multiaddrs.text(raw)
        if all(name != "p2p" for name, _ in named):
            text = f"{text}/p2p/{relay}"
        elif named[-1] != ("p2p", relay):
            continue
        if text not in out:
            out.append(text)
    return tuple(out[:MAX_RELAY_ADDRS])
