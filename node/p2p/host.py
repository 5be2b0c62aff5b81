"""The libp2p transport: :class:`P2PTransport`, our :class:`node.transport.Transport`.

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

Dials, gossip and streams keep py-libp2p's settings only where the sibling modules say so:
``swarm.py`` (one attempt per dial, no auto-redial), ``gossip.py`` (rates and queues),
``streams.py`` (yamux window timeouts), ``guard.py`` (the guard is a layer of the host, put in
once as the host is built: every inbound stream, py-libp2p's own protocols included, behind
one guard; limits from ``node.runtime.limits.NetLimits``, frames of py-libp2p's protocols as
``frame_checks.libp2p_framings`` says, faults reported to the handler given to
``set_fault_handler``), ``reqresp.py`` (request/response exchanges one after another on
pooled streams, and the server's loop over each inbound one).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import multiaddr
import structlog
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.identity.identify.identify import ID as IDENTIFY_ID
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service

from node.logs import route_library_logs
from node.p2p import multiaddrs
from node.p2p.frame_checks import libp2p_framings
from node.p2p.gossip import Gossip
from node.p2p.guard import GuardedHost, StreamGuard
from node.p2p.lag import LagClock
from node.p2p.link import LinkSpec
from node.p2p.multiaddrs import AddrError
from node.p2p.nat import NatService
from node.p2p.natconfig import NatConfig
from node.p2p.peer_pruning import PRUNE_INTERVAL_S, PeerStorePruner
from node.p2p.reqresp import RequestPool, serve_requests
from node.p2p.shaping import ShapedTCP
from node.p2p.streams import NetBulkStream, bulk_handler
from node.p2p.swarm import DIAL_TIMEOUT_S, OwnDials, PeerTracker, build_host, identify_handler
from node.runtime.limits import NetLimits
from node.runtime.unicast import HANDSHAKE_PROTOCOL_ID
from node.transport import (
    BulkStream,
    FaultHandler,
    PeerEvent,
    RequestHandler,
    StreamHandler,
    TransportError,
    agent_version,
)

DEFAULT_LISTEN = ("/ip4/127.0.0.1/tcp/0",)
#: our idle request streams are closed after this share of the idle limit we serve with:
#: well before a peer with the same limits closes them (node/p2p/reqresp.py, retry rule)
POOL_IDLE_SHARE = 0.25
#: stop() closes connections within this long, then tears down whatever is left.
STOP_GRACE_S = 2.0


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


class P2PTransport:
    """A libp2p host, pubsub and our request/response and bulk-stream helpers; see module doc."""

    def __init__(
        self,
        seed: bytes,
        *,
        listen: Sequence[str] = DEFAULT_LISTEN,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        limits: NetLimits | None = None,
        agent: str | None = None,
        nat: NatConfig | None = None,
        link: LinkSpec | None = None,
    ) -> None:
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        self._listen = [multiaddr.Multiaddr(a) for a in listen]
        self._dial_timeout_s = dial_timeout_s
        self.limits = limits = NetLimits() if limits is None else limits
        # An inbound request must arrive completely within this long, and its response be
        # written within it, or the stream is reset (a stalled peer cannot pin a handler).
        self._request_io_timeout_s = limits.read_deadline_s
        self._lag = LagClock()
        #: our requests' streams, reused (node/p2p/reqresp.py)
        self.requests = RequestPool(self._open, idle_s=limits.idle_timeout_s * POOL_IDLE_SHARE)
        route_library_logs("libp2p")  # py-libp2p detached its logger at import
        # every TCP connection behind this link (node/p2p/shaping.py); None: plain TCP
        self._shaper = None if link is None else ShapedTCP(link)
        host = build_host(create_new_key_pair(seed), limits, self._shaper)
        self._id = host.get_id()
        self._peer_id = self._id.to_base58()
        self._log = structlog.get_logger(__name__).bind(peer_id=self._peer_id)
        # the guard, once, as a layer of the host: every stream handler put on it from here
        # on, by py-libp2p (gossipsub, identify, ping) or by us, runs behind it (guard.py)
        self._guarded = GuardedHost(host, StreamGuard(limits, self._log, _now_ms,
                                                      libp2p_framings(limits)))
        self._host, self._guard = host, self._guarded.guard
        self._swarm: Any = host.get_network()
        self._peers = PeerTracker(self._log)
        self._own_dials = OwnDials(self._swarm)
        self._swarm.register_notifee(self._peers)
        self.pruner = PeerStorePruner(self._peer_id)
        agent = agent_version() if agent is None else agent
        host.set_stream_handler(IDENTIFY_ID, identify_handler(host, agent, limits))
        self._gossip = Gossip(self._guarded, self._log, limits)
        # AutoNAT, circuit relay v2 and hole punching (node/p2p/nat.py); None: none of them
        self.nat = None if nat is None else NatService(
            self._guarded, nat, limits.read_deadline_s, _now_ms)
        if self.nat is not None:
            self.nat.install()
        self._nursery: trio.Nursery | None = None
        self._stop = trio.Event()

    def set_fault_handler(self, handler: FaultHandler) -> None:
        self._guard.on_fault = handler

    @property
    def stream_faults(self) -> dict[str, int]:
        """Inbound streams ended for a peer's fault, by kind (and our handlers' own failures)."""
        return dict(self._guard.faults)

    # ---- identity and lifecycle -------------------------------------------------------------

    @property
    def peer_id(self) -> str:
        return self._peer_id

    @property
    def gossip_dropped(self) -> int:
        """Gossip messages lost to a full subscription buffer (see node/p2p/gossip.py)."""
        return self._gossip.dropped

    @property
    def gossip_received(self) -> dict[str, int]:
        """Gossip message copies peers pushed to us, and their bytes (node/p2p/gossip.py)."""
        return {"messages": self._gossip.received_messages,
                "bytes": self._gossip.received_bytes}

    def listen_addrs(self) -> list[str]:
        """Direct addresses, then those through relays we hold a reservation with."""
        relayed = [] if self.nat is None else self.nat.client.relayed_addrs()
        return [str(a) for a in self._host.get_addrs()] + relayed

    async def listen_addrs_changed(self, seen: Sequence[str]) -> list[str]:
        """Our addresses, once they differ from ``seen``: only the relayed ones change after
        the start, when the NAT loop makes, loses or outlives a reservation."""
        while (now := self.listen_addrs()) == list(seen):
            if self.nat is None:
                await trio.sleep_forever()
            else:
                await self.nat.relayed_moved()
        return now

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with AsyncExitStack() as stack:
            if self._shaper is not None:  # its connections' tasks outlive the host's
                await stack.enter_async_context(self._shaper.running())
            await stack.enter_async_context(self._host.run(self._listen))
            await stack.enter_async_context(background_trio_service(self._gossip.pubsub))
            await stack.enter_async_context(background_trio_service(self._gossip.router))
            await self._gossip.pubsub.wait_until_ready()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.nat is not None:
                    await nursery.start(self.nat.run)
                nursery.start_soon(self._prune_peerstore)
                nursery.start_soon(self._lag.run)
                nursery.start_soon(self.requests.run)
                self._log.info("transport.started", addrs=self.listen_addrs(),
                               link=None if self._shaper is None else str(self._shaper.spec))
                task_status.started()
                try:
                    await self._stop.wait()
                finally:
                    with trio.CancelScope(shield=True) as scope:
                        scope.deadline = trio.current_time() + STOP_GRACE_S
                        await self._quiesce()
                    nursery.cancel_scope.cancel()
        self._log.info("transport.stopped")

    async def _prune_peerstore(self) -> None:
        """Drop peers gone for long from py-libp2p's peer store (node/p2p/peer_pruning.py)."""
        while True:
            await trio.sleep(PRUNE_INTERVAL_S)  # a periodic sweep: absence sends no event
            self.prune_peerstore(trio.current_time())

    def prune_peerstore(self, now: float) -> list[str]:
        """One sweep of the peer store at ``now`` (trio's clock); the peers dropped."""
        store = self._host.get_peerstore()

        def forget(peer: str) -> None:
            try:
                store.clear_peerdata(ID.from_base58(peer))
            except Exception as exc:  # gone meanwhile: nothing to drop
                self._log.debug("transport.peerstore_prune_failed", peer=peer, error=repr(exc))

        gone = self.pruner.sweep([p.to_base58() for p in store.peer_ids()],
                                 set(self._peers.connected_peers()), now, forget)
        if gone:
            self._log.info("transport.peerstore_pruned", peers=len(gone),
                           left=len(store.peer_ids()))
        return gone

    def stop(self) -> None:
        """Ask ``run`` to shut down gracefully; it returns once everything is closed."""
        self._stop.set()

    async def _quiesce(self) -> None:
        """Stop accepting, close every connection: nothing left to spawn libp2p tasks."""
        self._peers.mute()
        for key, listener in list(self._swarm.listeners.items()):
            # Forgotten before it closes: py-libp2p reads the listening sockets' addresses for
            # every gossip message it forwards, and one on a closing socket raises OSError
            # out of the host's run (seen when stopping while gossip flows).
            del self._swarm.listeners[key]
            try:
                await listener.close()
            except Exception as exc:
                self._log.debug("transport.listener_close_failed", error=repr(exc))
        for peer in list(self._swarm.connections):
            try:
                await self._host.disconnect(peer)
            except Exception as exc:
                self._log.debug("transport.disconnect_failed", peer=str(peer), error=repr(exc))
        await self._peers.close()

    # ---- connections ------------------------------------------------------------------------

    async def connect(self, address: str) -> str:
        try:
            relayed = multiaddrs.is_relayed(address)
        except AddrError as exc:
            raise TransportError(f"cannot dial: {exc}") from None
        if relayed and self.nat is not None:
            with trio.move_on_after(self._dial_timeout_s):
                return await self._made(await self.nat.client.dial(address))
            raise TransportError(f"dial {address} timed out after {self._dial_timeout_s} s")
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(address))
        except Exception as exc:
            raise TransportError(f"not a dialable multiaddr with /p2p/: {address!r}") from exc
        if info.peer_id == self._id:
            raise TransportError("refusing to dial ourselves")
        self.pruner.touch(info.peer_id.to_base58())
        peerstore = self._host.get_peerstore()
        peerstore.clear_addrs(info.peer_id)
        peerstore.add_addrs(info.peer_id, info.addrs, 3600)
        self._swarm._negative_peer_cache.evict(str(info.peer_id))
        with trio.move_on_after(self._dial_timeout_s) as scope:
            try:
                relayed_only = self.nat is not None and self.nat.relayed_only(
                    info.peer_id.to_base58())
                if relayed_only or not self._swarm.get_connections(info.peer_id):
                    # this address only: py-libp2p's connect would settle for a relayed
                    # connection, and wait for its dial to the peer already in flight (the
                    # driver dials a peer's addresses side by side: node/runtime/dialing.py)
                    await self._made(await self._swarm.dial_addr(info.addrs[0], info.peer_id))
            except Exception as exc:
                raise TransportError(f"dial {address} failed: {exc!r}") from exc
        if scope.cancelled_caught:
            raise TransportError(f"dial {address} timed out after {self._dial_timeout_s} s")
        return info.peer_id.to_base58()

    async def _made(self, conn: Any) -> str:
        """The peer ``conn`` (just dialed) reaches; closed if it duplicates ours (swarm.py)."""
        if not self._own_dials.keep(conn):
            self._log.debug("transport.duplicate_dial_closed", peer=str(conn.muxed_conn.peer_id))
            await self._own_dials.close(conn, STOP_GRACE_S)
        return str(conn.muxed_conn.peer_id.to_base58())

    async def disconnect(self, peer_id: str) -> None:
        peer = ID.from_base58(peer_id)
        # py-libp2p 0.8.1 closes a connection only once the handlers of its streams are done
        # (a stalled stream's at its read deadline, seconds later): no new stream on it is
        # served meanwhile, and the open ones are reset so that their handlers end now
        muxed = [c.muxed_conn for c in self._swarm.connections.get(peer, [])]
        self._guard.closing(peer_id, muxed)
        for stream in [s for m in muxed for s in list(getattr(m, "streams", {}).values())]:
            with trio.CancelScope(shield=True):
                try:
                    await stream.reset()
                except Exception:
                    pass  # gone already: resetting is best effort
        await self._host.disconnect(peer)

    def connected_peers(self) -> list[str]:
        return self._peers.connected_peers()

    def open_stream_count(self, peer_id: str) -> int:
        """Streams yamux still tracks to ``peer_id`` (diagnostics; a leak shows up here)."""
        conns = self._swarm.connections.get(ID.from_base58(peer_id), [])
        return sum(len(getattr(conn.muxed_conn, "streams", ())) for conn in conns)

    def peer_events(self) -> trio.abc.ReceiveChannel[PeerEvent]:
        return self._peers.events()

    # ---- request/response -------------------------------------------------------------------

    def set_request_handler(
        self, protocol_id: str, handler: RequestHandler, *, max_request_bytes: int
    ) -> None:
        serve = serve_requests(handler, max_request_bytes=max_request_bytes, lag=self._lag,
                               deadline_s=self._request_io_timeout_s,
                               idle_s=self.limits.idle_timeout_s)
        # the driver meters messages (NetLimits), not streams: a stream carries many; but the
        # handshake is one request per connection, metered like any protocol's streams
        self._handle(protocol_id, serve, metered=protocol_id == HANDSHAKE_PROTOCOL_ID)

    async def request(
        self, peer_id: str, protocol_id: str, data: bytes, *, max_response_bytes: int
    ) -> bytes:
        return await self.requests.request(peer_id, protocol_id, data,
                                           max_response_bytes=max_response_bytes)

    # ---- bulk streams -----------------------------------------------------------------------

    def set_stream_handler(self, protocol_id: str, handler: StreamHandler) -> None:
        async def serve(stream: NetBulkStream) -> None:
            await handler(stream.peer_id, stream)

        self._handle(protocol_id, serve)

    async def open_stream(self, peer_id: str, protocol_id: str) -> BulkStream:
        if self.nat is not None:  # bulk goes direct when a hole punch is about to allow it
            await self.nat.prefer_direct(peer_id)
        return await self._open(peer_id, protocol_id)

    async def _open(self, peer_id: str, protocol_id: str) -> NetBulkStream:
        try:
            stream = await self._host.new_stream(ID.from_base58(peer_id), [TProtocol(protocol_id)])
        except Exception as exc:
            raise TransportError(f"open {protocol_id} to {peer_id} failed: {exc!r}") from exc
        return NetBulkStream(stream, peer_id)

    def _handle(self, protocol_id: str, serve: Any, *, metered: bool = True) -> None:
        self._guarded.serve(protocol_id, bulk_handler(serve), metered=metered)

    # ---- gossip -----------------------------------------------------------------------------

    async def subscribe(self, topic: str) -> trio.abc.ReceiveChannel[tuple[str, bytes]]:
        if self._nursery is None:
            raise TransportError("subscribe before the transport runs")
        return await self._gossip.subscribe(topic, self._nursery)

    async def publish(self, topic: str, data: bytes) -> None:
        await self._gossip.publish(topic, data)

    async def wait_topic_peer(self, topic: str, peer_id: str) -> None:
        await self._gossip.wait_topic_peer(topic, peer_id)


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
