"""The link shaper: every TCP connection of a host behind one :class:`node.p2p.link.LinkSpec`.

:class:`ShapedTCP` is py-libp2p's TCP transport whose raw connections, dialed and accepted
alike, are wrapped in a :class:`ShapedStream` before Noise and yamux see them: so identify,
gossipsub and our own streams all run over the same link. It is used only when a link is
configured (``P2PTransport(link=...)``); without one the host keeps the plain TCP transport.

:class:`ShapedStream` drives a :class:`node.p2p.link.LinkSchedule` for what it writes: a write
returns once the chunk has left at the ``up`` rate (the writer is held back, as by a full
socket buffer), and the chunk is handed to the socket after its one-way delay by a delivery
task, in order. What it reads is held to the ``down`` rate. Close returns at once, as a
socket's does; the delivery task hands over what is still on the way, then closes the socket.
The delivery tasks run in the nursery of :meth:`ShapedTCP.running`, which the transport holds
open while it runs: stopping it closes every shaped socket.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from libp2p.io.abc import ReadWriteCloser
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.transport.exceptions import OpenConnectionError
from libp2p.transport.tcp.tcp import TCP, TCPListener
from multiaddr import Multiaddr

from node.p2p.link import LinkSchedule, LinkSpec, TokenBucket

#: chunks written but not yet delivered, per connection; a writer beyond it waits, as one
#: would on a full TCP send window (the buffer is what lets writes overlap the delay)
IN_FLIGHT_CHUNKS = 1024


class ShapedStream(ReadWriteCloser):
    """A raw connection's byte stream seen through a link (see the module docstring)."""

    def __init__(self, inner: ReadWriteCloser, spec: LinkSpec, rng: random.Random,
                 nursery: trio.Nursery) -> None:
        self._inner = inner
        self._schedule = LinkSchedule(spec, rng)
        self._down = None if spec.down_bps is None else TokenBucket(spec.down_bps / 8)
        self._send, receive = trio.open_memory_channel[tuple[float, bytes]](IN_FLIGHT_CHUNKS)
        self._write_lock = trio.Lock()
        self._error: BaseException | None = None
        nursery.start_soon(self._deliver, receive)

    async def write(self, data: bytes) -> None:
        async with self._write_lock:  # chunks enter the link in the order they are written
            if self._error is not None:
                raise ConnectionClosedError(f"shaped link broke: {self._error!r}",
                                            transport="tcp")
            leg = self._schedule.send(len(data), trio.current_time())
            try:
                await self._send.send((leg.deliver_at_s, data))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise ConnectionClosedError("shaped link closed", transport="tcp") from None
            await trio.sleep_until(leg.depart_at_s)

    async def _deliver(self, receive: trio.MemoryReceiveChannel[tuple[float, bytes]]) -> None:
        """Hand each chunk to the socket at its delivery time, in order, until the stream is
        closed and drained; then, or when the socket breaks, or at the shaper's stop, close the
        socket. After a socket error further writes fail (the connection is broken)."""
        try:
            async with receive:  # closed on the way out: a writer waiting on it fails at once
                async for deliver_at_s, data in receive:
                    await trio.sleep_until(deliver_at_s)
                    await self._inner.write(data)
        except Exception as exc:  # the socket broke: writers learn it from _error
            self._error = exc
        finally:
            await self._inner.close()

    async def read(self, n: int | None = None) -> bytes:
        data = await self._inner.read(n)
        if data and self._down is not None:
            await trio.sleep_until(self._down.take(len(data), trio.current_time()))
        return data

    async def close(self) -> None:
        """No more writes; the delivery task closes the socket once the rest has arrived."""
        self._send.close()
        await trio.lowlevel.checkpoint()

    def get_remote_address(self) -> tuple[str, int] | None:
        return self._inner.get_remote_address()


class ShapedTCP(TCP):
    """py-libp2p's TCP transport with every raw connection behind ``spec``."""

    def __init__(self, spec: LinkSpec, rng: random.Random | None = None) -> None:
        super().__init__()
        self.spec = spec
        #: jitter and loss draws (seeded in tests); each connection gets its own from it
        self._rng = random.Random(random.SystemRandom().getrandbits(64)) if rng is None else rng
        self._nursery: trio.Nursery | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Hold the nursery of the connections' delivery tasks open for the block."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    def _nursery_or_fail(self) -> trio.Nursery:
        if self._nursery is None:
            raise OpenConnectionError("the link shaper is not running")
        return self._nursery

    def shape(self, stream: ReadWriteCloser, nursery: trio.Nursery) -> ShapedStream:
        rng = random.Random(self._rng.getrandbits(64))  # each connection its own draws
        return ShapedStream(stream, self.spec, rng, nursery)

    async def dial(self, maddr: Multiaddr) -> RawConnection:
        nursery = self._nursery_or_fail()
        raw: Any = await super().dial(maddr)
        return RawConnection(self.shape(raw.stream, nursery), True)

    async def dial_with_source(self, maddr: Multiaddr, source: tuple[str, int]) -> RawConnection:
        nursery = self._nursery_or_fail()
        raw: Any = await super().dial_with_source(maddr, source)
        return RawConnection(self.shape(raw.stream, nursery), True)

    def create_listener(self, handler_function: Callable[[Any], Awaitable[None]]) -> TCPListener:
        async def shaped(stream: ReadWriteCloser) -> None:
            await handler_function(self.shape(stream, self._nursery_or_fail()))

        return super().create_listener(shaped)
