"""Request/response over reused libp2p streams: the requester's pool and the server's loop.

Opening a stream costs a yamux stream open and a multistream-select negotiation before the
first byte of a request moves; a node sends most of its unicast messages to a few peers, one
after another. So a stream carries exchanges one after another (node/transport.py, Framing):
one request frame, then its response frame, then maybe the next request; never two requests
in flight on one stream. A peer that sends one request per stream and closes it is served the
same way.

Requester (:class:`RequestPool`)
--------------------------------
* A request takes the most recently used idle stream to the peer on the protocol that is
  still open both ways, or opens one. After a whole response the stream goes back to the
  pool; at most ``MAX_IDLE_STREAMS`` wait there per (peer, protocol), more are closed.
* Idle streams are closed (``close``, a FIN: the server's loop ends without fault) after
  ``idle_s``, which the transport sets well below the idle limit it serves with itself
  (``NetLimits.idle_timeout_s``), so a peer with the same limits rarely closes one first.
* A failure, a response over the limit and a cancellation reset the stream: it never goes
  back, so no later request can read an earlier one's response.
* Retry rule: a request on a reused stream is sent once more, on a fresh stream, only when
  the stream ended cleanly (the peer's FIN) before any byte of the response while its
  connection is still up. A server ends a stream cleanly only between exchanges, before it
  handles the next request (its idle close, or an older node that serves one request per
  stream); once it has handled one it answers it or resets the stream: so the request was
  not handled and is not handled twice. A write that fails, a reset, a connection that closed
  and a response cut short are not retried: the peer may have read the request, or handled it
  (its handler failed, it went away), and the caller hears of the failure as it would have
  with a stream per request. A fresh stream is never retried.

Server (:func:`serve_requests`): one loop per inbound stream
-------------------------------------------------------------
* The first request frame is due within ``deadline_s`` of the stream opening, as on a stream
  per request; a frame, once its first byte arrived, must be complete within ``deadline_s``
  of the loop's own time (node/p2p/lag.py): otherwise a stall fault. The response must be
  written within ``deadline_s`` too (a peer that does not read stalls).
* Between exchanges the peer may be silent for ``idle_s``; then the stream is closed (a FIN,
  no fault). The peer ending the stream between exchanges ends the loop quietly.
* A request frame over the limit is refused on its length prefix (an oversize fault); every
  fault resets the stream (the guard, node/p2p/guard.py).
* The handler is called once per request frame: the driver meters messages, not streams
  (``NetLimits.max_messages_per_peer_per_s``). The streams one peer holds open at once on a
  protocol are capped by the guard (``NetLimits.max_streams_per_protocol``, the extra one is
  refused as a flood): an honest requester holds its idle pool plus its requests in flight.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Awaitable, Callable

import trio

from node.p2p.lag import LagClock
from node.p2p.streams import NetBulkStream, Serve
from node.transport import (
    FRAME_HEADER,
    RequestHandler,
    StreamGone,
    check_limit,
    finish_frame,
    read_frame,
    write_frame,
)

#: idle streams kept per (peer, protocol); an honest node sends one message at a time per
#: service and peer, so a few cover its concurrent senders without holding many open
MAX_IDLE_STREAMS = 4

Opener = Callable[[str, str], Awaitable[NetBulkStream]]


class RequestPool:
    """The requester's side (module doc): ``request`` over pooled streams; ``run`` closes
    idle ones in a nursery. ``counts``: streams opened, requests on reused streams, retries,
    idle streams closed (status, benchmarks, tests)."""

    def __init__(self, open_stream: Opener, *, idle_s: float) -> None:
        self._open = open_stream
        self._idle_s = idle_s
        #: (peer, protocol) -> idle streams with the time each went idle, oldest first
        self._idle: dict[tuple[str, str], list[tuple[NetBulkStream, float]]] = {}
        self._wake = trio.Event()
        self.counts: Counter[str] = Counter()

    async def request(self, peer: str, protocol: str, data: bytes, *,
                      max_response_bytes: int) -> bytes:
        check_limit(max_response_bytes)
        key = (peer, protocol)
        stream = await self._take(key)
        if stream is not None:
            self.counts["reused"] += 1
            try:
                response = await _exchange(stream, data, max_response_bytes)
            except _Unread:
                self.counts["retried"] += 1  # the retry rule (module doc)
            else:
                await self._put(key, stream)
                return response
        stream = await self._open(peer, protocol)
        self.counts["opened"] += 1
        response = await _exchange(stream, data, max_response_bytes)
        await self._put(key, stream)
        return response

    def idle_count(self, peer: str, protocol: str) -> int:
        """Idle streams pooled to ``peer`` on ``protocol`` now."""
        return len(self._idle.get((peer, protocol), ()))

    async def _take(self, key: tuple[str, str]) -> NetBulkStream | None:
        idle = self._idle.get(key)
        while idle:
            stream, _ = idle.pop()
            if not idle:
                del self._idle[key]
            if stream.open_both_ways:
                return stream
            await _discard(stream)  # the peer closed it meanwhile: nothing was sent on it
        return None

    async def _put(self, key: tuple[str, str], stream: NetBulkStream) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= MAX_IDLE_STREAMS or not stream.open_both_ways:
            if not idle:
                del self._idle[key]
            await _close(stream)
            return
        idle.append((stream, trio.current_time()))
        self._wake.set()

    async def close_idle(self, now: float) -> int:
        """Close the streams idle since before ``now - idle_s``; how many were closed."""
        expired: list[NetBulkStream] = []
        for key in list(self._idle):
            idle = self._idle[key]
            keep = [(s, since) for s, since in idle if since + self._idle_s > now]
            expired += [s for s, since in idle if since + self._idle_s <= now]
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        for stream in expired:
            await _close(stream)
        self.counts["closed_idle"] += len(expired)
        return len(expired)

    async def run(self) -> None:
        """Close idle streams as they expire (sleeps while the pool is empty)."""
        while True:
            first = min((since for idle in self._idle.values() for _, since in idle),
                        default=math.inf)
            if first == math.inf:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            await trio.sleep_until(first + self._idle_s)
            await self.close_idle(trio.current_time())


class _Unread(StreamGone):
    """The peer had closed the stream before it could read the request (the retry rule)."""


async def _exchange(stream: NetBulkStream, data: bytes, max_bytes: int) -> bytes:
    """One exchange on ``stream``; on any failure or cancellation the stream is reset."""
    try:
        await write_frame(stream, data)
        first = await stream.read(FRAME_HEADER.size)
        if not first:
            if stream.connection_up:
                raise _Unread("the peer closed the stream before the response began")
            raise StreamGone("the connection closed before the response began")
        return await finish_frame(stream, first, max_bytes=max_bytes)
    except BaseException:
        await _discard(stream)
        raise


async def _discard(stream: NetBulkStream) -> None:
    """Reset a stream that failed or that the peer closed (shielded: also on cancel)."""
    with trio.CancelScope(shield=True):
        await stream.reset()


async def _close(stream: NetBulkStream) -> None:
    """End a sound stream we no longer want (a FIN: the server's loop ends quietly)."""
    with trio.CancelScope(shield=True):
        await stream.close()


def serve_requests(handler: RequestHandler, *, max_request_bytes: int, lag: LagClock,
                   deadline_s: float, idle_s: float) -> Serve:
    """The server's loop over one inbound stream (module doc)."""
    check_limit(max_request_bytes)

    async def next_request(stream: NetBulkStream, first_exchange: bool) -> bytes | None:
        if first_exchange:  # due as on a stream per request
            with lag.fail_after(deadline_s):
                return await read_frame(stream, max_bytes=max_request_bytes)
        first = b""
        with trio.move_on_after(idle_s):  # waiting between exchanges is no fault
            first = await stream.read(FRAME_HEADER.size)
        if not first:  # idle past the limit, or the peer ended the stream
            return None
        with lag.fail_after(deadline_s):  # in the loop's own time: a stall is the peer's
            return await finish_frame(stream, first, max_bytes=max_request_bytes)

    async def serve(stream: NetBulkStream) -> None:
        first_exchange = True
        while (request := await next_request(stream, first_exchange)) is not None:
            response = await handler(stream.peer_id, request)
            with lag.fail_after(deadline_s):
                await write_frame(stream, response)
            first_exchange = False

    return serve
