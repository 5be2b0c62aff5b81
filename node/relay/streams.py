"""Chunk streams of the relay service: the fetching and the serving side of one bulk protocol.

Wire (``protocol_id(net, "relay-chunks")``, one stream per (peer, version) and direction):
the fetcher writes the ``RelayManifest`` frame, then ``ChunkRequest`` frames; the server
answers each with a ``ChunkHeader`` frame and, when its status is OK, exactly ``size`` raw
bytes. Frames are length-prefixed (node/transport.py).

* Fetching (``request``): one ``_Fetch`` per (source, version). Requests leave in order; the
  reply's bytes go straight into a ``ChunkWriter`` (temporary file, hashed as it arrives), and
  the digest goes to the machine as ``ChunkReceived``. A reply that was not asked for, has the
  wrong size or names another version is a protocol violation (``ChunkFailed`` with a
  penalty). A new source for a version closes the fetch from the old one (the machine pulls a
  version from one source at a time). A broken stream reports ``ChunkFailed``.
* Serving: each accepted stream feeds its requests to the machine as ``ChunkRequested``; the
  machine's ``ServeChunk``/``RefuseChunk`` effects are queued to that stream (bounded; a peer
  that overflows it is cut off) and written from the chunk file, paced by the node's shared
  upload limiter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from node.relay.chunk_store import ChunkStore, ChunkStoreError, ChunkWriter
from node.relay.upload_meter import UploadMeter
from node.service import NodeContext
from node.transport import BulkStream, ProtocolViolation, TransportError, read_frame, write_frame
from protocol.codec import MAX_FRAME_BYTES, decode, encode
from protocol.errors import InvalidMessage
from protocol.machine import Received
from protocol.names import protocol_id
from protocol.relay.events import ChunkFailed, ChunkReceived, ChunkRequested, StreamClosed
from protocol.relay.machine import DEFAULT_WINDOW, MAX_QUEUED_PER_PEER, RelayMachine
from protocol.relay.manifest import (
    ChunkHeader,
    ChunkRequest,
    ChunkStatus,
    Manifest,
    RelayManifest,
)

CHUNK_PROTOCOL_NAME = "relay-chunks"
MAX_SMALL_FRAME = 256
#: bytes per write when sending a chunk (also the pacing granularity of the upload limiter)
SEND_PIECE = 64 * 1024
#: bytes per read when receiving a chunk
RECV_PIECE = 256 * 1024
#: opening a stream and its first frame must complete within this long
OPEN_TIMEOUT_S = 10.0
#: queued answers per serving stream: what the machine may queue for one peer plus the
#: requests a well-behaved fetcher keeps in flight; beyond it the peer is cut off
SESSION_QUEUE = MAX_QUEUED_PER_PEER + 4 * DEFAULT_WINDOW
#: queued requests per fetch stream; the machine's window keeps it far below this
FETCH_QUEUE = 4 * MAX_QUEUED_PER_PEER
VIOLATION_PENALTY = 20


class StreamViolation(ProtocolViolation):
    """The peer broke the chunk-stream protocol."""


class UploadLimiter:
    """A token bucket shared by every outgoing chunk stream: a capped uplink (0 = no cap)."""

    def __init__(self, bps: int) -> None:
        self.bps = bps
        self._next = 0.0

    async def take(self, n: int) -> None:
        if self.bps <= 0:
            return
        start = max(trio.current_time(), self._next)
        self._next = start + n / self.bps
        await trio.sleep_until(start)


@dataclass(eq=False)
class _Fetch:
    peer: str
    manifest: Manifest
    send: trio.MemorySendChannel[int]
    receive: trio.MemoryReceiveChannel[int]
    requested: set[int] = field(default_factory=set)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    failed: bool = False
    #: (reason, penalty) once the stream broke; ("", 0) while it is fine
    error: tuple[str, int] = ("", 0)


@dataclass(eq=False)
class _Session:
    peer: str
    manifest_id: bytes
    send: trio.MemorySendChannel[tuple[int, ChunkStatus | None]]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class StreamsOwner(Protocol):
    """What the chunk streams use of the relay service (node/relay/service.py passes itself)."""

    ctx: NodeContext
    store: ChunkStore
    #: verified-but-not-yet-stored chunks: (peer, manifest id, index) -> open writer
    pending: dict[tuple[str, bytes, int], ChunkWriter]
    counters: dict[str, int]

    @property
    def machine(self) -> RelayMachine: ...

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` for the life of the service; a failure is logged, never fatal."""
        ...

    async def submit(self, event: object) -> None:
        """Feed ``event`` to the relay machine and perform its effects."""
        ...


class RelayStreams:
    def __init__(self, service: StreamsOwner, upload_limit_bps: int) -> None:
        self.service = service
        self.limiter = UploadLimiter(upload_limit_bps)
        self.meter = UploadMeter()
        self.protocol = protocol_id(service.ctx.network_id, CHUNK_PROTOCOL_NAME)
        self._fetches: dict[tuple[str, bytes], _Fetch] = {}
        self._sessions: dict[tuple[str, bytes], _Session] = {}

    def install(self) -> None:
        self.service.ctx.transport.set_stream_handler(self.protocol, self._serve_stream)

    def status(self) -> dict[str, Any]:
        return {
            "fetch_streams": len(self._fetches),
            "serve_streams": len(self._sessions),
            "pending_chunks": len(self.service.pending),
        }

    # ------------------------------------------------------------ fetching

    def request(self, peer: str, manifest_id: bytes, index: int) -> None:
        fetch = self._fetches.get((peer, manifest_id))
        if fetch is None:
            t = self.service.machine.transfers.get(manifest_id)
            if t is None:
                return
            for (other, mid), old in list(self._fetches.items()):
                if mid == manifest_id and other != peer and not old.requested:
                    # nothing asked of it any more: the machine moved on to other sources
                    # (one per stripe of the plan, so a busy one stays open)
                    old.scope.cancel()
            # Bounded (FETCH_QUEUE): the machine's window keeps a handful queued at most.
            send, receive = trio.open_memory_channel[int](FETCH_QUEUE)
            fetch = _Fetch(peer, t.manifest, send, receive)
            self._fetches[(peer, manifest_id)] = fetch
            self.service.spawn(self._run_fetch, fetch)
        fetch.requested.add(index)
        try:
            fetch.send.send_nowait(index)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.service.spawn(
                self.service.submit, ChunkFailed(peer, manifest_id, index, "fetch queue full")
            )

    def close_version(self, manifest_id: bytes) -> None:
        for (_, mid), fetch in list(self._fetches.items()):
            if mid == manifest_id:
                fetch.scope.cancel()

    async def _run_fetch(self, fetch: _Fetch) -> None:
        key = (fetch.peer, fetch.manifest.id)
        stream: BulkStream | None = None
        reason = ""
        penalty = 0
        with fetch.scope:
            try:
                with trio.fail_after(OPEN_TIMEOUT_S):
                    stream = await self.service.ctx.transport.open_stream(fetch.peer, self.protocol)
                    await write_frame(stream, encode(fetch.manifest.message))
            except trio.TooSlowError:
                reason = "stream open timed out"
            except TransportError as exc:
                reason = f"stream open failed: {exc}"
            if stream is not None and not reason:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        self._guarded,
                        fetch,
                        nursery.cancel_scope,
                        self._fetch_writer(fetch, stream),
                    )
                    await self._guarded(
                        fetch, nursery.cancel_scope, self._fetch_reader(fetch, stream)
                    )
                    nursery.cancel_scope.cancel()
                reason, penalty = fetch.error
        if self._fetches.get(key) is fetch:
            del self._fetches[key]
        fetch.send.close()
        if stream is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await (stream.reset() if reason else stream.close())
        if reason and fetch.requested and not fetch.failed:
            await self.service.submit(
                ChunkFailed(
                    fetch.peer, fetch.manifest.id, min(fetch.requested), reason, None, penalty
                )
            )

    async def _guarded(
        self, fetch: _Fetch, scope: trio.CancelScope, work: Coroutine[Any, Any, None]
    ) -> None:
        """Run one side of a fetch; a failure is recorded on the fetch and ends both sides."""
        try:
            await work
        except TransportError as exc:
            fetch.error = (f"stream failed: {exc}", 0)
        except (StreamViolation, InvalidMessage) as exc:
            fetch.error = (f"chunk stream violation: {exc}", VIOLATION_PENALTY)
        except (ChunkStoreError, OSError) as exc:
            fetch.error = (f"cannot write the chunk: {exc}", 0)
        else:
            return
        scope.cancel()

    async def _fetch_writer(self, fetch: _Fetch, stream: BulkStream) -> None:
        async for index in fetch.receive:
            request = ChunkRequest(manifest_id=fetch.manifest.id, index=index)
            await write_frame(stream, encode(request))

    async def _fetch_reader(self, fetch: _Fetch, stream: BulkStream) -> None:
        service, m = self.service, fetch.manifest
        while True:
            header = decode(await read_frame(stream, max_bytes=MAX_SMALL_FRAME), ChunkHeader)
            if header.manifest_id != m.id or header.index not in fetch.requested:
                raise StreamViolation(f"unrequested chunk {header.index}")
            if header.status is not ChunkStatus.OK:
                fetch.failed = True  # reported here: no second report from _run_fetch
                await service.submit(
                    ChunkFailed(
                        fetch.peer,
                        m.id,
                        header.index,
                        f"refused: {header.status.name}",
                        header.status,
                    )
                )
                return
            size = m.chunk_span(header.index)[1]
            if header.size != size:
                raise StreamViolation(f"chunk {header.index} is {header.size} bytes, not {size}")
            writer = service.store.writer(size)
            try:
                while writer.written < size:
                    piece = await stream.read(min(RECV_PIECE, size - writer.written))
                    if not piece:
                        raise TransportError(f"stream ended inside chunk {header.index}")
                    writer.write(piece)
            except BaseException:
                writer.abort()
                raise
            fetch.requested.discard(header.index)
            old = service.pending.pop((fetch.peer, m.id, header.index), None)
            if old is not None:
                old.abort()
            service.pending[(fetch.peer, m.id, header.index)] = writer
            await service.submit(ChunkReceived(fetch.peer, m.id, header.index, writer.digest()))

    # ------------------------------------------------------------ serving

    def serve(self, peer: str, manifest_id: bytes, index: int, status: ChunkStatus | None) -> None:
        session = self._sessions.get((peer, manifest_id))
        if session is None:
            return  # the peer closed its stream: nobody to answer
        try:
            session.send.send_nowait((index, status))
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.service.ctx.log.warning("relay.session_overflow", peer=peer)
            session.scope.cancel()

    async def _serve_stream(self, peer: str, stream: BulkStream) -> None:
        service = self.service
        with trio.fail_after(OPEN_TIMEOUT_S):
            frame = await read_frame(stream, max_bytes=MAX_FRAME_BYTES)
        message = decode(frame, RelayManifest)  # InvalidMessage: the transport resets, logs
        await service.submit(Received(peer, message))
        manifest_id = message.envelope.content_hash
        t = service.machine.transfers.get(manifest_id)
        if t is None:
            return  # invalid, stale, untrusted or superseded: the machine said why
        manifest = t.manifest
        key = (peer, manifest_id)
        # Bounded (SESSION_QUEUE, see there): answers wait here while the stream drains.
        send, receive = trio.open_memory_channel[tuple[int, ChunkStatus | None]](SESSION_QUEUE)
        session = _Session(peer, manifest_id, send)
        old = self._sessions.get(key)
        if old is not None:
            old.scope.cancel()
        self._sessions[key] = session
        try:
            with session.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._session_writer, session, manifest, stream, receive)
                    await self._session_reader(session, stream)
                    nursery.cancel_scope.cancel()
        finally:
            if self._sessions.get(key) is session:
                del self._sessions[key]
            send.close()
            with trio.CancelScope(shield=True):
                await service.submit(StreamClosed(peer, manifest_id))

    async def _session_reader(self, session: _Session, stream: BulkStream) -> None:
        while True:
            try:
                frame = await read_frame(stream, max_bytes=MAX_SMALL_FRAME)
            except TransportError:
                return  # the fetcher closed or reset its stream: it is done with us
            req = decode(frame, ChunkRequest)
            if req.manifest_id != session.manifest_id:
                raise StreamViolation("request for another version on this stream")
            await self.service.submit(ChunkRequested(session.peer, session.manifest_id, req.index))

    async def _session_writer(
        self,
        session: _Session,
        manifest: Manifest,
        stream: BulkStream,
        receive: trio.MemoryReceiveChannel[tuple[int, ChunkStatus | None]],
    ) -> None:
        try:
            await self._write_answers(manifest, stream, receive)
        except TransportError:
            session.scope.cancel()  # the fetcher went away mid-answer

    async def _write_answers(
        self,
        manifest: Manifest,
        stream: BulkStream,
        receive: trio.MemoryReceiveChannel[tuple[int, ChunkStatus | None]],
    ) -> None:
        service = self.service
        async for index, status in receive:
            if status is None:
                try:
                    f = service.store.open_chunk(manifest.chunk_hashes[index])
                except ChunkStoreError:
                    status = ChunkStatus.GONE  # garbage-collected meanwhile
            if status is not None:
                await write_frame(
                    stream,
                    encode(
                        ChunkHeader(manifest_id=manifest.id, index=index, status=status, size=0)
                    ),
                )
                continue
            size = manifest.chunk_span(index)[1]
            with f:
                await write_frame(
                    stream,
                    encode(
                        ChunkHeader(
                            manifest_id=manifest.id, index=index, status=ChunkStatus.OK, size=size
                        )
                    ),
                )
                sent = 0
                while sent < size:
                    piece = f.read(min(SEND_PIECE, size - sent))
                    if not piece:
                        raise ChunkStoreError(f"chunk {index} file is short")
                    await self.limiter.take(len(piece))
                    await stream.write(piece)
                    self.meter.sent(len(piece), trio.current_time())
                    sent += len(piece)
            service.counters["chunks_out"] += 1
            service.counters["bytes_out"] += size
