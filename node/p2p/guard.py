"""The guard in front of every inbound stream: ours and the ones py-libp2p serves itself.

What it promises: no exception raised while serving a peer's stream reaches py-libp2p's run
loop. A stream that misbehaves is reset, the fault is reported once to the fault handler
(the driver penalizes, node/penalties.py lists the costs) and logged as one line without a
traceback; a traceback is logged only for an exception in one of our own handlers that no
peer's bytes explain (our bug), and repeats of it are summarized (node/logs.RepeatLog).

Where it sits (the one place this project patches py-libp2p 0.8.1's stream handling): it is a
layer of the host, put in once when the transport builds the host (:class:`GuardedHost`);
from then on no stream handler reaches the host without it, whoever registers it and when.

* the swarm's stream handler, ``BasicHost._swarm_stream_handler`` (protocol negotiation,
  then the protocol's handler), is wrapped: an exception escaping it is caught here. In
  py-libp2p 0.8.1 an exception out of a handler propagates through
  ``SwarmConn._handle_muxed_stream`` into the connection's nursery and ends the host: e.g.
  ``Pubsub.continuously_read_stream`` lets protobuf's ``DecodeError`` out for a
  non-protobuf frame on ``/meshsub/1.x``. The same wrapper caps a peer's open streams.
* every handler in ``host.multiselect.handlers`` (gossipsub's, identify, identify push,
  ping, the ones py-libp2p registers later, and ours) is wrapped per protocol as it is
  stored there (:class:`_GuardedHandlers`; ours through ``GuardedHost.serve``, where a
  failure no peer explains is our bug, not the peer's fault): a cap on one peer's open
  streams on it, and for py-libp2p's protocols a stream proxy that follows the frames as
  they are read (:class:`node.p2p.framing.FramedReads`) so oversize, truncated and stalled
  frames are seen and penalized (py-libp2p 0.8.1 drops them quietly, which makes them free),
  also when py-libp2p's handler gives up on a frame by itself (its own timeout).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from google.protobuf.message import DecodeError
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IncompleteReadError, IOException, MessageTooLarge
from libp2p.network.stream.exceptions import StreamError
from libp2p.stream_muxer.exceptions import MuxedStreamError

from node.logs import RepeatLog
from node.p2p.framing import FramedReads, Framing, PeerFault
from node.runtime.limits import NetLimits
from node.transport import (
    FaultHandler,
    FrameTooLarge,
    ProtocolViolation,
    StreamGone,
    TransportError,
)
from protocol.buckets import KeyedBuckets
from protocol.errors import InvalidMessage, RemoteProtocolError

Handler = Callable[[INetStream], Awaitable[None]]
#: the stream was closed or broken under us: nobody's fault worth points
_GONE = (StreamGone, StreamError, MuxedStreamError, IOException, trio.BrokenResourceError,
         trio.ClosedResourceError)


def classify(exc: BaseException) -> tuple[str, str] | None:
    """The fault kind and a short detail a peer's stream raised, or None if no peer's fault.

    An exception group (a handler's nursery) is the peer's fault if any of its leaves is."""
    if isinstance(exc, BaseExceptionGroup):
        for leaf in exc.exceptions:
            found = classify(leaf)
            if found is not None:
                return found
        return None
    detail = f"{type(exc).__name__}: {exc}"[:200]
    if isinstance(exc, StreamGone):
        return None
    if isinstance(exc, PeerFault):
        return exc.kind, exc.detail
    if isinstance(exc, (FrameTooLarge, MessageTooLarge)):
        return "oversize", detail
    if isinstance(exc, trio.TooSlowError):
        return "stall", "no progress within the read deadline"
    if isinstance(exc, (DecodeError, InvalidMessage, UnicodeDecodeError)):
        return "undecodable", detail
    if isinstance(exc, (RemoteProtocolError, ProtocolViolation)):
        return "invalid", detail
    if isinstance(exc, (ParseError, IncompleteReadError)):
        return "bad_framing", detail
    if isinstance(exc, TransportError):  # ours: truncated frame or broken read
        return "bad_framing", detail
    return None


class StreamGuard:
    """Caps, fault reports and logging for every inbound stream of one host; see module doc.

    ``framings``: py-libp2p's protocols whose frames the guard follows (see framing.py)."""

    def __init__(self, limits: NetLimits, log: Any, now_ms: Callable[[], int],
                 framings: Mapping[str, Framing] | None = None) -> None:
        self._limits = limits
        self._log = log
        self._now_ms = now_ms
        self._repeats = RepeatLog(log, interval_ms=int(limits.log_summary_interval_s * 1000))
        self.on_fault: FaultHandler | None = None
        self._framings = dict(framings or {})
        self._frame_budgets = {
            protocol: KeyedBuckets(f.max_frames_per_min / 60, f.max_frames_per_min)
            for protocol, f in self._framings.items() if f.max_frames_per_min}
        #: the handlers ``wrap`` made (a handler stored into a guarded host is wrapped once)
        self._wrapped: weakref.WeakSet[Handler] = weakref.WeakSet()
        self._per_peer: Counter[str] = Counter()
        self._per_protocol: Counter[tuple[str, str]] = Counter()
        #: the open streams of protocols whose newer streams replace older ones (gossipsub's),
        #: oldest first, by peer and protocol (``_make_room``)
        self._held: dict[tuple[str, str], list[trio.CancelScope]] = {}
        #: connections we are closing (a banned peer's): muxed connection -> peer, forgotten
        #: with the connection
        self._closing: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        per_min = limits.streams_opened_per_min
        #: streams one peer opened on one protocol lately (keyed by peer and protocol)
        self._opened = KeyedBuckets(per_min / 60, per_min)
        #: streams refused or reset for a fault, by kind (status, benchmarks)
        self.faults: Counter[str] = Counter()

    def install(self, host: Any) -> None:
        """Become a layer of ``host``: its stream entry point, and every handler it holds now
        or is given later, run behind this guard (a handler not made by ``wrap`` is taken as
        py-libp2p's: ``ours=False``)."""
        inner = host._swarm_stream_handler
        host.get_network().set_stream_handler(self._accepting(inner))
        host.multiselect.handlers = _GuardedHandlers(self, host.multiselect.handlers)

    def guards(self, handler: Any) -> bool:
        """Whether ``handler`` is one ``wrap`` made (already behind this guard)."""
        try:
            return handler in self._wrapped
        except TypeError:  # not weakly referenceable: not one of ours
            return False

    def fault(self, peer: str, protocol: str, kind: str, detail: str) -> None:
        """Count and report a fault; logged here (first time per peer and kind, then
        summaries) only while no fault handler is set: the driver logs what it penalizes."""
        self.faults[kind] += 1
        if self.on_fault is not None:
            self.on_fault(peer, kind, f"{detail} on {protocol}")
        else:
            self._repeats.note((peer, kind), self._now_ms(), "transport.peer_fault",
                               peer=peer, protocol=protocol, kind=kind, detail=detail)

    def closing(self, peer: str, muxed_conns: list[Any]) -> None:
        """We are closing these connections of ``peer``: refuse their new streams."""
        for conn in muxed_conns:
            self._closing[conn] = peer

    def _accepting(self, inner: Handler) -> Handler:
        async def accept(net_stream: INetStream) -> None:
            peer = net_stream.muxed_conn.peer_id.to_base58()
            if self._closing.get(net_stream.muxed_conn) == peer:
                await _reset(net_stream)  # a connection we are closing: nothing more on it
                return
            if self._per_peer[peer] >= self._limits.max_streams_per_peer:
                self.fault(peer, "any", "flood",
                           f"over {self._limits.max_streams_per_peer} open streams")
                await _reset(net_stream)
                return
            self._per_peer[peer] += 1
            try:
                await _until_connection_closed(net_stream, inner)
            except Exception as exc:
                await self._failed(net_stream, peer, _protocol_of(net_stream), exc, ours=False)
            finally:
                _release(self._per_peer, peer)

        return accept

    def wrap(self, protocol: str, handler: Handler, *, ours: bool,
             metered: bool = True) -> Handler:
        """``handler`` behind the per-protocol stream cap and the fault handling; ``metered``:
        also behind the budget of streams a peer opens on it per minute (a request/response
        protocol whose streams carry any number of messages meters them itself instead)."""
        cap = self._limits.max_streams_per_protocol
        framing = None if ours else self._framings.get(protocol)
        replaces = framing is not None and framing.long_lived
        if replaces:
            cap = self._limits.max_gossip_streams_per_peer
        if framing is not None and framing.max_streams:
            cap = framing.max_streams

        async def guarded(net_stream: INetStream) -> None:
            peer = net_stream.muxed_conn.peer_id.to_base58()
            key = (peer, protocol)
            if self._per_protocol[key] >= cap and not replaces:
                self.fault(peer, protocol, "flood", f"over {cap} open streams")
                await _reset(net_stream)
                return
            if metered and not self._opened.take(key, self._now_ms()):
                self.fault(peer, protocol, "flood", f"over {self._limits.streams_opened_per_min}"
                                                    " streams opened a minute")
                await _reset(net_stream)
                return
            scope = trio.CancelScope()  # cancelled when a newer stream replaces this one
            if replaces:
                self._make_room(key, cap, scope)
            else:
                self._per_protocol[key] += 1
            stream: Any = net_stream
            if framing is not None:
                budget = self._frame_budgets.get(protocol)
                admit = None if budget is None else (
                    lambda: budget.take(peer, self._now_ms()))
                stream = FramedReads(net_stream, framing, self._limits, lambda f: self.fault(
                    peer, protocol, f.kind, f.detail), admit)
            try:
                with scope:
                    await handler(stream)
                    if isinstance(stream, FramedReads) and stream.unfinished:
                        # py-libp2p's handler gave up mid-frame (its own timeout, a reset)
                        # and said nothing: the peer left a frame unfinished
                        self.fault(peer, protocol, "bad_framing", "a frame left unfinished")
                if scope.cancelled_caught:  # replaced: the peer writes on its newer stream
                    await _reset(net_stream)
            except Exception as exc:
                await self._failed(net_stream, peer, protocol, exc, ours=ours)
            finally:
                if replaces:
                    self._unhold(key, scope)
                else:
                    _release(self._per_protocol, key)

        self._wrapped.add(guarded)
        return guarded

    def _make_room(self, key: tuple[str, str], cap: int, scope: trio.CancelScope) -> None:
        """Hold ``scope``'s stream as the peer's newest on a protocol whose streams replace
        each other, ending its oldest ones (a reset, no fault) so that at most ``cap`` stay.

        Gossipsub writes to a peer on one stream only, and py-libp2p 0.8.1 drops that stream
        without closing it when a write on it fails (a yamux window shut for 5 s while the
        reader was busy; ``Pubsub.write_msg`` -> ``_handle_dead_peer``), then opens a new one
        while the peer stays connected; each connection's ``connected`` event also opens one,
        racing the others. The reader never sees the old ones end: refusing the newest
        would cut an honest peer off and charge it for it. go-libp2p's pubsub resets the older
        of two inbound streams from one peer the same way. A peer that opens many is bounded
        by this cap (what it holds open) and charged past ``streams_opened_per_min``."""
        held = self._held.setdefault(key, [])
        while len(held) >= cap:
            held.pop(0).cancel()
        held.append(scope)

    def _unhold(self, key: tuple[str, str], scope: trio.CancelScope) -> None:
        held = self._held.get(key, [])
        if scope in held:
            held.remove(scope)
        if not held:
            self._held.pop(key, None)

    async def _failed(self, net_stream: INetStream, peer: str, protocol: str,
                      exc: Exception, *, ours: bool) -> None:
        try:
            self._report(peer, protocol, exc, ours=ours)
        finally:  # reported first: whoever sees the reset may look for the fault at once
            await _reset(net_stream)

    def _report(self, peer: str, protocol: str, exc: Exception, *, ours: bool) -> None:
        found = classify(exc)
        if _reported(exc):
            return
        if found is not None:
            self.fault(peer, protocol, *found)
        elif _gone(exc):
            self._log.debug("transport.stream_gone", peer=peer, protocol=protocol,
                            error=repr(exc)[:200])
        elif not ours:
            # py-libp2p failed on what the peer sent: the peer's bytes, upstream's bug
            self.fault(peer, protocol, "invalid", f"{type(exc).__name__}: {exc}"[:200])
        else:  # our own handler failed on something no peer explains: our bug
            self.faults["handler_failed"] += 1
            self._repeats.note(("ours", f"{protocol} {type(exc).__name__}"), self._now_ms(),
                               "transport.handler_failed", protocol=protocol, peer=peer,
                               error=repr(exc)[:200], exc_info=exc)


class _GuardedHandlers(dict[Any, Any]):
    """``Multiselect.handlers`` of a guarded host: py-libp2p's ``add_handler`` (behind
    ``host.set_stream_handler``) stores every protocol's handler here, and each is put behind
    the guard as it is stored, unless ``wrap`` made it already. (py-libp2p 0.8.1 only ever
    assigns items of this dict, which is what this map intercepts.)"""

    def __init__(self, guard: StreamGuard, handlers: Mapping[Any, Any]) -> None:
        super().__init__()
        self._guard = guard
        for protocol, handler in handlers.items():
            self[protocol] = handler

    def __setitem__(self, protocol: Any, handler: Any) -> None:
        if protocol is not None and handler is not None and not self._guard.guards(handler):
            handler = self._guard.wrap(str(protocol), handler, ours=False)
        super().__setitem__(protocol, handler)


class GuardedHost:
    """A py-libp2p host with the guard as its layer (module doc), from construction on.

    ``host`` is the py-libp2p host itself (dials, streams, py-libp2p's services, which may
    register handlers on it: those are guarded as py-libp2p's); ``serve`` registers one of our
    own handlers; ``guard`` counts faults and refuses streams of connections being closed."""

    def __init__(self, host: Any, guard: StreamGuard) -> None:
        self.host = host
        self.guard = guard
        guard.install(host)

    def serve(self, protocol_id: str, handler: Handler, *, metered: bool = True) -> None:
        """Serve ``protocol_id`` with our ``handler``, behind the guard as ours: a failure no
        peer's bytes explain is logged as our bug, not charged to the peer. ``metered``: see
        ``StreamGuard.wrap``."""
        guarded = self.guard.wrap(protocol_id, handler, ours=True, metered=metered)
        self.host.set_stream_handler(TProtocol(protocol_id), guarded)


async def _until_connection_closed(net_stream: INetStream, inner: Handler) -> None:
    """``inner(net_stream)``, cancelled if the stream's connection closes first.

    py-libp2p 0.8.1: a handler blocked in ``Yamux.read_stream`` (waiting on the stream's
    event) is not always woken when the connection closes (``Yamux.close`` sets the events of
    the streams it still tracks, and a stream reset just before is no longer tracked): the
    handler waited for ever and kept the closed connection's whole object graph alive (about
    60 KiB per attacker key in the fuzz bench, where every key's gossip stream stayed
    blocked). The connection's own ``event_closed`` ends the handler instead."""
    closed = getattr(net_stream.muxed_conn, "event_closed", None)
    if closed is None:
        await inner(net_stream)
        return
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await closed.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        try:
            await inner(net_stream)
        finally:
            nursery.cancel_scope.cancel()


def _reported(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_reported(leaf) for leaf in exc.exceptions)
    return isinstance(exc, PeerFault) and exc.reported


def _gone(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_gone(leaf) for leaf in exc.exceptions)
    return isinstance(exc, _GONE)


def _protocol_of(net_stream: INetStream) -> str:
    try:
        return str(net_stream.get_protocol() or "negotiation")
    except Exception:
        return "negotiation"


def _release(counter: Counter[Any], key: Any) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


async def _reset(net_stream: INetStream) -> None:
    with trio.CancelScope(shield=True):
        try:
            await net_stream.reset()
        except Exception:
            pass  # already gone: resetting is best effort
