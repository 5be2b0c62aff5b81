"""libp2p streams as :class:`node.transport.BulkStream`, and the guard around our handlers.

* :class:`NetBulkStream` turns libp2p's errors into :class:`node.transport.TransportError`
  and its EOF into ``b""``.
* yamux: a write waits at most 5 s for the reader to open its window, then py-libp2p fails
  it; bulk writes are therefore sent in frame-sized pieces and a piece that timed out
  (nothing of it sent) is retried for as long as the stream lives, so backpressure has no
  time limit.
* :func:`bulk_handler`: a handler of ours as the libp2p stream handler py-libp2p calls; the
  transport puts node/p2p/guard.py's guard around it (a peer's bad frame, a timeout or a
  failing handler resets that stream, is penalized or logged, and nothing else).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from libp2p.abc import INetStream
from libp2p.stream_muxer.yamux.yamux import HEADER_SIZE as YAMUX_HEADER_SIZE
from libp2p.stream_muxer.yamux.yamux import MAX_MESSAGE_SIZE as YAMUX_MAX_MESSAGE_SIZE

from node.transport import StreamGone

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

    @property
    def open_both_ways(self) -> bool:
        """Neither side has closed or reset the stream, and its connection is up, as far as
        this side knows yet (a FIN or reset still in flight is not known)."""
        muxed = getattr(self._stream, "muxed_stream", None)
        if muxed is None:
            return True
        if any(getattr(muxed, flag, False) for flag in
               ("closed", "send_closed", "recv_closed", "reset_received")):
            return False
        return self.connection_up

    @property
    def connection_up(self) -> bool:
        """The stream's connection is neither closed nor closing, as far as this side knows."""
        conn = getattr(getattr(self._stream, "muxed_stream", None), "muxed_conn", None)
        return not any(getattr(getattr(conn, name, None), "is_set", lambda: False)()
                       for name in ("event_closed", "event_shutting_down"))

    async def read(self, max_bytes: int) -> bytes:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        try:
            return await self._stream.read(max_bytes)
        except EOFError:  # libp2p's StreamEOF
            return b""
        except Exception as exc:
            raise StreamGone(f"read from {self._peer_id} failed: {exc!r}") from exc

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
                    raise StreamGone(f"write to {self._peer_id} failed: {exc!r}") from exc

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


def bulk_handler(serve: Serve) -> Callable[[INetStream], Awaitable[None]]:
    """``serve`` on a :class:`NetBulkStream`; the stream is closed when it returns (errors
    propagate to the guard, which resets the stream)."""

    async def handle(net_stream: INetStream) -> None:
        stream = NetBulkStream(net_stream, net_stream.muxed_conn.peer_id.to_base58())
        await serve(stream)
        await stream.close()  # our FIN; yamux forgets the stream once both are sent

    return handle
