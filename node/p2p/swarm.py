"""The libp2p host as we build it, and which peers it is connected to.

:func:`build_host`: TCP + Noise + yamux only. Settings changed from py-libp2p's defaults, on
purpose:

* inbound connections: at most ``NetLimits.max_connections`` open at once (py-libp2p's own
  inbound cap never gave its slots back: :class:`_LiveConnectionCap`), and each one's handler
  ends when that connection closes, not when the swarm stops (py-libp2p kept every inbound
  connection ever accepted in memory: :func:`_end_inbound_handlers_with_their_connection`);
* dials: one attempt per ``connect`` (swarm retries off), bounded by ``DIAL_TIMEOUT_S``; the
  swarm's auto-connector, which would redial any peer in the peerstore on its own, is never
  started: redialing is the daemon's decision. (The transport also clears the swarm's 60 s
  "negative cache" of failed peers before each dial and replaces the peer's stored addresses
  by the one given: py-libp2p dials one TCP address per peer, so a stale port would shadow a
  restarted peer's new one.)

:func:`identify_handler`: identify answers as py-libp2p's does, but announces this node as
``symphony-node/<version>`` (py-libp2p 0.8.1 announces its own ``py-libp2p/0.8.1`` from a
module constant, the same for every host in the process).

:class:`OwnDials` keeps one connection per dial race: a connection our own dial makes to a
peer that another of our dials has already connected, no worse (direct, or this one relayed),
is closed at once. Dials to a peer's addresses run side by side (node/runtime/dialing.py), and
two of them can finish together, before the loser is cancelled; the extra connection would
otherwise live as long as the peer's. Connections the peer dialed are never compared: when
both sides dial each other at once, each closing its own outbound one for the other's would
leave none.

:class:`PeerTracker` is the swarm's notifee: it turns per-connection notifications into
per-peer transitions (``PeerEvent(peer, True)`` on the first connection, ``False`` when the
last one closes) delivered on one bounded channel, whose backpressure stalls new connections
rather than losing an event.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any

import multiaddr
import structlog
import trio
from libp2p import new_swarm
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.host.basic_host import BasicHost
from libp2p.identity.identify import identify as libp2p_identify
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.transport.tcp.tcp import TCP
from libp2p.utils.varint import encode_uvarint

from node.p2p.circuit_hop import is_relayed
from node.p2p.framing import PeerFault
from node.runtime.limits import NetLimits
from node.transport import PeerEvent

#: One dial attempt (TCP connect + Noise + yamux) fails after this long.
DIAL_TIMEOUT_S = 10.0
#: Connect/disconnect events buffered for the daemon; beyond it new connections wait for it.
PEER_EVENT_BUFFER = 256


class _LiveConnectionCap:
    """Stands in for py-libp2p 0.8.1's ``Swarm._inbound_limiter`` (a trio.CapacityLimiter of
    max_connections - min_connections = 250 tokens): ``Swarm._handle_inbound_connection``
    takes a token per inbound connection and, after the upgrade, holds it until the whole
    swarm stops (``await self.manager.wait_finished()``), not until the connection ends. So
    after 250 inbound connections in a process's life every new one was refused: an attacker
    with 250 keys, or ordinary churn, silenced the node (seen in the fuzz bench: every fresh
    identity refused after ~240 bans). This cap counts the connections open now instead."""

    def __init__(self, swarm: Any, cap: int) -> None:
        self._swarm = swarm
        self.total_tokens = cap

    def acquire_nowait(self) -> None:
        if len(self._swarm.get_connections()) >= self.total_tokens:
            raise trio.WouldBlock

    def release(self) -> None:
        """Nothing to give back: the count is of live connections."""


def build_host(key_pair: Any, limits: NetLimits, tcp: TCP | None = None) -> BasicHost:
    """The host over ``tcp`` (a plain ``TCP()`` unless given: a link shaper's)."""
    swarm: Any = new_swarm(
        key_pair=key_pair,
        sec_opt={
            NOISE_PROTOCOL_ID: NoiseTransport(
                key_pair, noise_privkey=create_new_x25519_key_pair().private_key
            )
        },
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        transports=[TCP() if tcp is None else tcp],
        retry_config=RetryConfig(max_retries=0),
        connection_config=ConnectionConfig(dial_timeout=DIAL_TIMEOUT_S),
    )

    async def _never_start() -> None:
        """Replaces the auto-connector's start: redialing peers is the daemon's decision."""

    swarm.auto_connector.start = _never_start
    swarm._inbound_limiter = _LiveConnectionCap(swarm, limits.max_connections)
    _end_inbound_handlers_with_their_connection(swarm)
    return BasicHost(network=swarm)


class _ConnectionEnded(Exception):
    """An inbound connection closed: its listener handler may return (see below)."""


#: set in the task of a listener's inbound connection handler, and only there
_LISTENER_INBOUND: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "listener_inbound", default=False)


def _end_inbound_handlers_with_their_connection(swarm: Any) -> None:
    """py-libp2p 0.8.1, ``Swarm._do_handle_inbound_connection``: after upgrading a listener's
    inbound connection it awaits ``self.manager.wait_finished()``, the end of the whole swarm
    (trio closes the TCP stream when the handler returns, so it must outlive the connection).
    Each inbound connection's task, socket, Noise session and yamux muxer therefore stayed
    in memory after the connection closed, for the life of the process: in the fuzz bench,
    where every ban brings a fresh key and a fresh connection, the daemon grew by about 20 MiB
    a minute. Here the handler waits for its own connection's ``event_closed`` instead, then
    returns through upstream's own error path (which closes what is left, quietly). Only the
    listener's path waits: other callers of ``upgrade_inbound_raw_conn`` (circuit relay) get
    the connection back at once, as before."""
    handle, upgrade = swarm._do_handle_inbound_connection, swarm.upgrade_inbound_raw_conn

    async def handle_until_closed(*args: Any) -> None:
        _LISTENER_INBOUND.set(True)  # this handler's own task: its context is its own copy
        await handle(*args)

    async def upgrade_then_wait(raw_conn: Any, maddr: Any) -> Any:
        muxed = await upgrade(raw_conn, maddr)
        closed = getattr(muxed, "event_closed", None)
        if not _LISTENER_INBOUND.get() or closed is None:
            return muxed
        await closed.wait()
        raise _ConnectionEnded

    swarm._do_handle_inbound_connection = handle_until_closed
    swarm.upgrade_inbound_raw_conn = upgrade_then_wait


def identify_handler(host: BasicHost, agent: str, limits: NetLimits) -> Any:
    """The identify protocol's handler (varint-prefixed protobuf), announcing ``agent``.

    Built on py-libp2p 0.8.1's private ``_mk_identify_protobuf`` (the message its own
    ``identify_handler_for`` sends), with only ``agent_version`` replaced. The asking peer
    sends nothing on this protocol: bytes from it, watched for while we answer and up to the
    read deadline after, are a fault. Nothing else is: a peer that hangs up (its stream or
    connection closed while we answer, whatever py-libp2p raises for it) costs no points."""

    async def answer(stream: INetStream) -> None:
        observed = None
        try:
            observed = libp2p_identify._remote_address_to_multiaddr(stream.get_remote_address())
        except Exception:
            pass  # no observed address to report: the field stays empty
        message = libp2p_identify._mk_identify_protobuf(host, observed)
        message.agent_version = agent
        data = message.SerializeToString()
        try:
            await stream.write(encode_uvarint(len(data)) + data)
            await stream.close()
        except Exception:
            return  # the asker is gone: an answer nobody reads is no fault of theirs

    async def handle(stream: INetStream) -> None:
        extra = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer, stream)
            with trio.move_on_after(limits.read_deadline_s):
                try:
                    extra = await stream.read(1)
                except Exception:
                    pass  # ended or broken (EOF, reset, a closed connection): nothing sent
            if extra:
                nursery.cancel_scope.cancel()
        if extra:
            raise PeerFault("undecodable", "the asking peer sent bytes on identify")

    return handle


class OwnDials:
    """The connections our dials made; whether a new one duplicates one of them (module doc)."""

    def __init__(self, swarm: Any) -> None:
        self._swarm = swarm
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()

    def keep(self, conn: Any) -> bool:
        """Whether ``conn``, which our dial just made, is to be kept; if so, it joins ours."""
        relayed = is_relayed(conn)
        for other in self._swarm.get_connections(conn.muxed_conn.peer_id):
            if (other is not conn and other in self._made and not other.event_closed.is_set()
                    and (relayed or not is_relayed(other))):
                return False
        self._made.add(conn)
        return True

    async def close(self, conn: Any, grace_s: float) -> None:
        """Close a duplicate, even while our dial is being cancelled (at most ``grace_s``)."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + grace_s
            try:
                await conn.close()
            except Exception:
                pass  # closed by the peer meanwhile: nothing left to close


class PeerTracker(INotifee):
    """Per-peer connect/disconnect transitions from the swarm's per-connection notifications."""

    def __init__(self, log: structlog.typing.FilteringBoundLogger) -> None:
        self._log = log
        self._conns: dict[str, set[INetConn]] = {}
        self._events_send: trio.MemorySendChannel[PeerEvent] | None = None
        self._muted = False

    def connected_peers(self) -> list[str]:
        return [peer for peer, conns in self._conns.items() if conns]

    def events(self) -> trio.abc.ReceiveChannel[PeerEvent]:
        if self._events_send is not None:
            raise RuntimeError("peer_events() has one consumer; it was already called")
        # Bounded so a stuck consumer shows up as stalled connects, never as lost events.
        send, receive = trio.open_memory_channel[PeerEvent](PEER_EVENT_BUFFER)
        self._events_send = send
        return receive

    def mute(self) -> None:
        """Deliver no more events: the transport is stopping and closes connections itself."""
        self._muted = True

    async def close(self) -> None:
        """End the consumer's channel (after :meth:`mute` and the connections closing).

        The transport has closed every connection by then; py-libp2p may not have notified
        each close yet, and never will once its nursery is cancelled, so none is left counted.
        """
        self._muted = True
        self._conns.clear()
        if self._events_send is not None:
            await self._events_send.aclose()

    async def _on_connection(self, conn: INetConn, *, opened: bool) -> None:
        peer = conn.muxed_conn.peer_id.to_base58()
        conns = self._conns.setdefault(peer, set())
        before = bool(conns)
        (conns.add if opened else conns.discard)(conn)
        if not conns:
            del self._conns[peer]
        if before == bool(conns):
            return
        self._log.info("transport.peer", peer=peer, connected=opened)
        if self._events_send is not None and not self._muted:
            try:
                await self._events_send.send(PeerEvent(peer, opened))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the daemon stopped listening: it is shutting down

    # ---- INotifee ---------------------------------------------------------------------------

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        await self._on_connection(conn, opened=True)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        await self._on_connection(conn, opened=False)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass
