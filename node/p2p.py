"""The libp2p transport: the only module of the project that imports libp2p (py-libp2p 0.8.1).

:class:`P2PTransport` implements :class:`node.transport.Transport` (read that module for the
contract) over TCP + Noise + yamux; no QUIC (it truncated bulk transfers), no mplex (5x slower),
no TLS/secio/plaintext (a peer offering only those is refused).

Lifecycle: build it from the node's 32-byte Ed25519 seed (the same key that signs, so the
libp2p peer id equals ``crypto.peer_id.peer_id_from_public_key``), then start it in the
daemon's root nursery::

    transport = P2PTransport(seed, listen=["/ip4/127.0.0.1/tcp/0"])
    await nursery.start(transport.run)      # listening, gossip ready
    ...
    nursery.cancel_scope.cancel()           # or transport.stop(): graceful, bounded

``run`` returns when ``stop()`` is called or raises Cancelled when cancelled; both ways it first
closes listeners and connections (shielded, at most ``STOP_GRACE_S``) so no libp2p task is left
spawning into a closing nursery, then stops pubsub and the swarm. ``open_p2p(seed)`` wraps
that as an async context manager (tests, benchmarks).

Settings changed from py-libp2p's defaults, on purpose (all are constants below):

* dials: one attempt per ``connect`` (swarm retries off), bounded by ``dial_timeout_s``; the
  swarm's 60 s "negative cache" of failed peers is cleared before each dial and the peer's
  stored addresses replaced by the one given (py-libp2p dials one TCP address per peer, so a
  stale port would shadow a restarted peer's new one); the swarm's auto-connector, which
  would redial any peer in the peerstore on its own, is never started: redialing is the
  daemon's decision.
* gossipsub: heartbeat every ``GOSSIP_HEARTBEAT_S`` (py-libp2p defaults to 120 s); spam
  protection raised from 10 to ``GOSSIP_MAX_MSGS_PER_TOPIC_PER_S`` messages per forwarding peer
  per topic per second, and our own publishes paced below it (beyond the cap py-libp2p
  silently stops forwarding, own messages included); each peer's outbound RPC queue raised from
  32 to ``GOSSIP_OUTBOUND_QUEUE`` (a full queue silently drops); each subscription is drained
  at once from py-libp2p's 32-message channel (which drops when full) into our own
  ``GOSSIP_SUBSCRIPTION_BUFFER``-message channel, whose overflow is counted in
  ``gossip_dropped`` and logged.
* yamux: a write waits at most 5 s for the reader to open its window, then py-libp2p fails
  it; bulk writes are therefore sent in frame-sized pieces and a piece that timed out (nothing
  of it sent) is retried for as long as the stream lives, so backpressure has no time limit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import multiaddr
import structlog
import trio
from libp2p import new_swarm
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.host.basic_host import BasicHost
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub import gossipsub as libp2p_gossipsub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import HEADER_SIZE as YAMUX_HEADER_SIZE
from libp2p.stream_muxer.yamux.yamux import MAX_MESSAGE_SIZE as YAMUX_MAX_MESSAGE_SIZE
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.tools.anyio_service import background_trio_service
from libp2p.transport.tcp.tcp import TCP

from node.transport import (
    BulkStream,
    FrameTooLarge,
    PeerEvent,
    RequestHandler,
    StreamHandler,
    TransportError,
    check_limit,
    read_frame,
    write_frame,
)

DEFAULT_LISTEN = ("/ip4/127.0.0.1/tcp/0",)
#: One dial attempt (TCP connect + Noise + yamux) fails after this long.
DIAL_TIMEOUT_S = 10.0
#: An inbound request must arrive completely within this long, and its response be written
#: within this long, or the stream is reset (a stalled peer cannot pin a handler task).
REQUEST_IO_TIMEOUT_S = 10.0
#: stop() closes connections within this long, then tears down whatever is left.
STOP_GRACE_S = 2.0

GOSSIP_PROTOCOLS = [
    libp2p_gossipsub.PROTOCOL_ID_V12,  # IDONTWANT: fewer duplicate sends
    libp2p_gossipsub.PROTOCOL_ID_V11,
    libp2p_gossipsub.PROTOCOL_ID,
]
GOSSIP_DEGREE, GOSSIP_DEGREE_LOW, GOSSIP_DEGREE_HIGH = 6, 4, 12  # the gossipsub spec's D
#: Mesh maintenance period; py-libp2p's default of 120 s leaves late joiners out for minutes.
GOSSIP_HEARTBEAT_S = 1
#: Spam cap per forwarding peer per topic per second (py-libp2p default: 10, beyond which it
#: silently stops forwarding). A forwarder relays everyone's messages on a topic, so this caps
#: the whole topic's rate; the protocol layer validates and penalizes peers on content.
GOSSIP_MAX_MSGS_PER_TOPIC_PER_S = 1000
#: Our own publishes are paced to at most this many per second (they count against the cap
#: too). Measured: py-libp2p spends ~1-2 ms of CPU per message per hop, so one process cannot
#: sustain much more; publishing faster only grows queues and stalls everything else, shutdown
#: included. Bursts up to this size in a second go out at once.
GOSSIP_OWN_PUBLISH_PER_S = 200
#: Outbound RPCs queued per peer before py-libp2p drops (its default: 32).
GOSSIP_OUTBOUND_QUEUE = 4096
#: Messages buffered per subscription for a slow consumer; beyond it they are dropped and
#: counted (gossip is best effort; the ledger re-syncs over request/response).
GOSSIP_SUBSCRIPTION_BUFFER = 1024
#: Connect/disconnect events buffered for the daemon; beyond it new connections wait for it.
PEER_EVENT_BUFFER = 256

_YAMUX_PIECE = YAMUX_MAX_MESSAGE_SIZE - YAMUX_HEADER_SIZE
_WINDOW_TIMEOUT_TEXT = "Timed out waiting for window update"


class _NetBulkStream:
    """A :class:`node.transport.BulkStream` over a libp2p stream; libp2p errors become ours."""

    def __init__(self, stream: INetStream, peer_id: str) -> None:
        self._stream = stream
        self._peer_id = peer_id

    @property
    def peer_id(self) -> str:
        return self._peer_id

    async def read(self, max_bytes: int) -> bytes:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        try:
            return await self._stream.read(max_bytes)
        except EOFError:  # libp2p's StreamEOF
            return b""
        except Exception as exc:
            raise TransportError(f"read from {self._peer_id} failed: {exc!r}") from exc

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), _YAMUX_PIECE):
            piece = bytes(view[start : start + _YAMUX_PIECE])
            while True:
                try:
                    await self._stream.write(piece)
                    break
                except Exception as exc:
                    if _WINDOW_TIMEOUT_TEXT in repr(exc.__cause__) + repr(exc):
                        continue  # a one-frame write that timed out sent nothing: retry
                    raise TransportError(f"write to {self._peer_id} failed: {exc!r}") from exc

    async def close(self) -> None:
        try:
            await self._stream.close()
        except Exception:
            pass  # already gone: closing is best effort

    async def reset(self) -> None:
        try:
            await self._stream.reset()
        except Exception:
            pass


class _ConnectionNotifee(INotifee):
    """Turns per-connection notifications into per-peer connect/disconnect transitions."""

    def __init__(self, transport: P2PTransport) -> None:
        self._transport = transport

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        await self._transport._on_connection(conn, opened=True)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        await self._transport._on_connection(conn, opened=False)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass


class P2PTransport:
    """A libp2p host, pubsub and our request/response and bulk-stream helpers; see module doc."""

    def __init__(
        self,
        seed: bytes,
        *,
        listen: Sequence[str] = DEFAULT_LISTEN,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        request_io_timeout_s: float = REQUEST_IO_TIMEOUT_S,
    ) -> None:
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        key_pair = create_new_key_pair(seed)
        self._listen = [multiaddr.Multiaddr(a) for a in listen]
        self._dial_timeout_s = dial_timeout_s
        self._request_io_timeout_s = request_io_timeout_s
        self._host = _build_host(key_pair)
        self._id = self._host.get_id()
        self._peer_id = self._id.to_base58()
        self._log = structlog.get_logger(__name__).bind(peer_id=self._peer_id)
        self._swarm: Any = self._host.get_network()
        self._swarm.register_notifee(_ConnectionNotifee(self))
        self._gossipsub = libp2p_gossipsub.GossipSub(
            protocols=GOSSIP_PROTOCOLS,
            degree=GOSSIP_DEGREE,
            degree_low=GOSSIP_DEGREE_LOW,
            degree_high=GOSSIP_DEGREE_HIGH,
            heartbeat_interval=GOSSIP_HEARTBEAT_S,
            max_messages_per_topic_per_second=GOSSIP_MAX_MSGS_PER_TOPIC_PER_S,
        )
        self._pubsub = Pubsub(self._host, self._gossipsub)
        self._pubsub.peer_queues = _SizedQueues()
        self._conns: dict[str, set[INetConn]] = {}
        self._events_send: trio.MemorySendChannel[PeerEvent] | None = None
        self._subscriptions: set[str] = set()
        self._publish_times: deque[float] = deque()
        self._nursery: trio.Nursery | None = None
        self._stop = trio.Event()
        self._stopping = False
        self.gossip_dropped = 0

    # ---- identity and lifecycle -------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def listen_addrs(self) -> list[str]:
        return [str(a) for a in self._host.get_addrs()]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self._host.run(self._listen))
            await stack.enter_async_context(background_trio_service(self._pubsub))
            await stack.enter_async_context(background_trio_service(self._gossipsub))
            await self._pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._log.info("transport.started", addrs=self.listen_addrs())
                task_status.started()
                try:
                    await self._stop.wait()
                finally:
                    with trio.CancelScope(shield=True) as scope:
                        scope.deadline = trio.current_time() + STOP_GRACE_S
                        await self._quiesce()
                    nursery.cancel_scope.cancel()
        self._log.info("transport.stopped")

    def stop(self) -> None:
        """Ask ``run`` to shut down gracefully; it returns once everything is closed."""
        self._stop.set()

    async def _quiesce(self) -> None:
        """Stop accepting, close every connection: nothing left to spawn libp2p tasks."""
        self._stopping = True
        for listener in list(self._swarm.listeners.values()):
            try:
                await listener.close()
            except Exception as exc:
                self._log.debug("transport.listener_close_failed", error=repr(exc))
        for peer in list(self._swarm.connections):
            try:
                await self._host.disconnect(peer)
            except Exception as exc:
                self._log.debug("transport.disconnect_failed", peer=str(peer), error=repr(exc))
        if self._events_send is not None:
            await self._events_send.aclose()

    # ---- connections ------------------------------------------------------------------------

    async def connect(self, address: str) -> str:
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(address))
        except Exception as exc:
            raise TransportError(f"not a dialable multiaddr with /p2p/: {address!r}") from exc
        if info.peer_id == self._id:
            raise TransportError("refusing to dial ourselves")
        peerstore = self._host.get_peerstore()
        peerstore.clear_addrs(info.peer_id)
        peerstore.add_addrs(info.peer_id, info.addrs, 3600)
        self._swarm._negative_peer_cache.evict(str(info.peer_id))
        with trio.move_on_after(self._dial_timeout_s) as scope:
            try:
                await self._host.connect(info)
            except Exception as exc:
                raise TransportError(f"dial {address} failed: {exc!r}") from exc
        if scope.cancelled_caught:
            raise TransportError(f"dial {address} timed out after {self._dial_timeout_s} s")
        return info.peer_id.to_base58()

    async def disconnect(self, peer_id: str) -> None:
        await self._host.disconnect(ID.from_base58(peer_id))

    def connected_peers(self) -> list[str]:
        return [peer for peer, conns in self._conns.items() if conns]

    def open_stream_count(self, peer_id: str) -> int:
        """Streams yamux still tracks to ``peer_id`` (diagnostics; a leak shows up here)."""
        conns = self._swarm.connections.get(ID.from_base58(peer_id), [])
        return sum(len(getattr(conn.muxed_conn, "streams", ())) for conn in conns)

    def peer_events(self) -> trio.abc.ReceiveChannel[PeerEvent]:
        if self._events_send is not None:
            raise RuntimeError("peer_events() has one consumer; it was already called")
        # Bounded so a stuck consumer shows up as stalled connects, never as lost events.
        send, receive = trio.open_memory_channel[PeerEvent](PEER_EVENT_BUFFER)
        self._events_send = send
        return receive

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
        if self._events_send is not None and not self._stopping:
            try:
                await self._events_send.send(PeerEvent(peer, opened))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the daemon stopped listening: it is shutting down

    # ---- request/response -------------------------------------------------------------------

    def set_request_handler(
        self, protocol_id: str, handler: RequestHandler, *, max_request_bytes: int
    ) -> None:
        check_limit(max_request_bytes)

        async def serve(stream: _NetBulkStream) -> None:
            with trio.fail_after(self._request_io_timeout_s):
                request = await read_frame(stream, max_bytes=max_request_bytes)
            response = await handler(stream.peer_id, request)
            with trio.fail_after(self._request_io_timeout_s):
                await write_frame(stream, response)

        self._host.set_stream_handler(TProtocol(protocol_id), self._guarded(protocol_id, serve))

    async def request(
        self, peer_id: str, protocol_id: str, data: bytes, *, max_response_bytes: int
    ) -> bytes:
        check_limit(max_response_bytes)
        stream = await self._open(peer_id, protocol_id)
        try:
            await write_frame(stream, data)
            return await read_frame(stream, max_bytes=max_response_bytes)
        except BaseException:
            with trio.CancelScope(shield=True):
                await stream.reset()
            raise
        finally:
            with trio.CancelScope(shield=True):
                await stream.close()

    # ---- bulk streams -----------------------------------------------------------------------

    def set_stream_handler(self, protocol_id: str, handler: StreamHandler) -> None:
        async def serve(stream: _NetBulkStream) -> None:
            await handler(stream.peer_id, stream)

        self._host.set_stream_handler(TProtocol(protocol_id), self._guarded(protocol_id, serve))

    async def open_stream(self, peer_id: str, protocol_id: str) -> BulkStream:
        return await self._open(peer_id, protocol_id)

    async def _open(self, peer_id: str, protocol_id: str) -> _NetBulkStream:
        try:
            stream = await self._host.new_stream(ID.from_base58(peer_id), [TProtocol(protocol_id)])
        except Exception as exc:
            raise TransportError(f"open {protocol_id} to {peer_id} failed: {exc!r}") from exc
        return _NetBulkStream(stream, peer_id)

    def _guarded(self, protocol_id: str, serve: Any) -> Any:
        """A libp2p stream handler that never lets a peer's misbehaviour escape into libp2p."""

        async def handle(net_stream: INetStream) -> None:
            peer = net_stream.muxed_conn.peer_id.to_base58()
            stream = _NetBulkStream(net_stream, peer)
            try:
                await serve(stream)
                await stream.close()  # our FIN; yamux forgets the stream once both are sent
            except (FrameTooLarge, TransportError, trio.TooSlowError) as exc:
                self._log.warning("transport.bad_stream", peer=peer, protocol=protocol_id,
                                  error=repr(exc))
                await stream.reset()
            except Exception as exc:
                self._log.exception("transport.handler_failed", peer=peer, protocol=protocol_id,
                                    error=repr(exc))
                await stream.reset()

        return handle

    # ---- gossip -----------------------------------------------------------------------------

    async def subscribe(self, topic: str) -> trio.abc.ReceiveChannel[tuple[str, bytes]]:
        if self._nursery is None:
            raise TransportError("subscribe before the transport runs")
        if topic in self._subscriptions:
            raise TransportError(f"already subscribed to {topic!r}")
        self._subscriptions.add(topic)
        subscription = await self._pubsub.subscribe(topic)
        # Buffered so a consumer that is briefly busy loses nothing; see the module doc.
        send, receive = trio.open_memory_channel[tuple[str, bytes]](GOSSIP_SUBSCRIPTION_BUFFER)
        self._nursery.start_soon(self._pump, topic, subscription, send)
        return receive

    async def _pump(self, topic: str, subscription: Any, send: trio.MemorySendChannel[Any]) -> None:
        async with send:
            while True:
                try:
                    message = await subscription.get()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    return
                origin = ID(message.from_id)
                if origin == self._id:
                    continue
                try:
                    send.send_nowait((origin.to_base58(), bytes(message.data)))
                except trio.WouldBlock:
                    self.gossip_dropped += 1
                    self._log.warning("transport.gossip_dropped", topic=topic,
                                      dropped=self.gossip_dropped)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # the consumer closed its end

    async def publish(self, topic: str, data: bytes) -> None:
        now = trio.current_time()
        times = self._publish_times
        while times and times[0] <= now - 1.0:
            times.popleft()
        if len(times) >= GOSSIP_OWN_PUBLISH_PER_S:
            await trio.sleep_until(times[0] + 1.0)  # rate pacing, not a wait for a condition
        else:
            await trio.lowlevel.checkpoint()  # a publish loop must never starve the event loop
        times.append(trio.current_time())
        try:
            await self._pubsub.publish(topic, data)
        except Exception as exc:
            raise TransportError(f"publish on {topic!r} failed: {exc!r}") from exc

    async def wait_topic_peer(self, topic: str, peer_id: str) -> None:
        await self._pubsub.wait_for_mesh(ID.from_base58(peer_id), topic, timeout=math.inf)


class _SizedQueues(dict[Any, Any]):
    """py-libp2p's per-peer outbound RPC queues, each enlarged to GOSSIP_OUTBOUND_QUEUE.

    py-libp2p creates a queue of 32 per peer with no option to size it; this map resizes each
    queue as py-libp2p stores it, for this host only (no module-level patching).
    """

    def __setitem__(self, key: Any, queue: Any) -> None:
        queue._queue.max_size = GOSSIP_OUTBOUND_QUEUE
        super().__setitem__(key, queue)


def _build_host(key_pair: Any) -> BasicHost:
    swarm: Any = new_swarm(
        key_pair=key_pair,
        sec_opt={
            NOISE_PROTOCOL_ID: NoiseTransport(
                key_pair, noise_privkey=create_new_x25519_key_pair().private_key
            )
        },
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        transports=[TCP()],
        retry_config=RetryConfig(max_retries=0),
        connection_config=ConnectionConfig(dial_timeout=DIAL_TIMEOUT_S),
    )

    async def _never_start() -> None:
        """Replaces the auto-connector's start: redialing peers is the daemon's decision."""

    swarm.auto_connector.start = _never_start
    return BasicHost(network=swarm)


@asynccontextmanager
async def open_p2p(seed: bytes, **kwargs: Any) -> AsyncIterator[P2PTransport]:
    """Run a transport for the duration of the block; stopped gracefully on exit."""
    transport = P2PTransport(seed, **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(transport.run)
        try:
            yield transport
        finally:
            transport.stop()
