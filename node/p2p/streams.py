"""libp2p streams as :class:`node.transport.BulkStream`, and the guard around our handlers.

* :class:`NetBulkStream` turns libp2p's errors into :class:`node.transport.TransportError`
  and its EOF into ``b""``.
* yamux: a write waits at most 5 s for the reader to open its window, then py-libp2p fails
  it; bulk writes are therefore sent in frame-sized pieces and a piece that timed out
  (nothing of it sent) is retried for as long as the stream lives, so backpressure has no
  time limit.
* :func:`guarded_handler`: py-libp2p lets an exception escaping a stream handler reach its
  host's run loop, so every handler we register is wrapped: a peer's bad frame, a timeout
  or a failing handler resets that stream and is logged with the peer id, and nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.stream_muxer.yamux.yamux import HEADER_SIZE as YAMUX_HEADER_SIZE
from libp2p.stream_muxer.yamux.yamux import MAX_MESSAGE_SIZE as YAMUX_MAX_MESSAGE_SIZE

from node.transport import FrameTooLarge, TransportError

_YAMUX_PIECE = YAMUX_MAX_MESSAGE_SIZE - YAMUX_HEADER_SIZE
_WINDOW_TIMEOUT_TEXT = "Timed out waiting for window update"


class NetBulkStream:
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


Serve = Callable[[NetBulkStream], Awaitable[None]]


def guarded_handler(
    log: Any, protocol_id: str, serve: Serve
) -> Callable[[INetStream], Awaitable[None]]:
    """A libp2p stream handler that never lets a peer's misbehaviour escape into libp2p."""

    async def handle(net_stream: INetStream) -> None:
        peer = net_stream.muxed_conn.peer_id.to_base58()
        stream = NetBulkStream(net_stream, peer)
        try:
            await serve(stream)
            await stream.close()  # our FIN; yamux forgets the stream once both are sent
        except (FrameTooLarge, TransportError, trio.TooSlowError) as exc:
            log.warning("transport.bad_stream", peer=peer, protocol=protocol_id, error=repr(exc))
            await stream.reset()
        except Exception as exc:
            log.exception("transport.handler_failed", peer=peer, protocol=protocol_id,
                          error=repr(exc))
            await stream.reset()

    return handle
