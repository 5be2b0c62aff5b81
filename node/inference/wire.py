"""Frames of an inference session on a libp2p stream, hidden-state codecs, link delay.

* Each frame is one length-prefixed message (node.transport.write_frame / read_frame) of at
  most ``protocol.codec.MAX_FRAME_BYTES``; a larger announced frame is refused before its body.
* :func:`pack_hidden` / :func:`unpack_hidden` are the one pair of hidden-state codecs both ends
  use: fp16 (or fp32) little-endian, row-major (positions, hidden); ``unpack_hidden`` raises
  ``InvalidMessage`` for a wrong byte count or a non-finite value (the sender's fault).
* :class:`SessionStream` holds every outgoing frame for ``delay_ms`` before it writes it: a
  per-link delay for experiments (loopback has none and this machine has no netem). Off (0)
  by default.
"""

from __future__ import annotations

import numpy as np
import trio

from node.transport import BulkStream, read_frame, write_frame
from protocol.codec import MAX_FRAME_BYTES, Message, decode, encode
from protocol.errors import InvalidMessage
from protocol.inference.messages import Precision, check_hidden_size

_DTYPES = {Precision.FP16: np.dtype("<f2"), Precision.FP32: np.dtype("<f4")}


def pack_hidden(hidden: np.ndarray, precision: Precision) -> bytes:
    """(n, C) float array -> wire bytes; ValueError for values the precision cannot hold."""
    out = np.ascontiguousarray(hidden, dtype=_DTYPES[precision])
    if not np.isfinite(out).all():
        raise ValueError(f"hidden states are not finite in {precision.value}")
    return out.tobytes()


def unpack_hidden(data: bytes, n: int, hidden_size: int, precision: Precision) -> np.ndarray:
    """Wire bytes -> (n, hidden_size) float32, or InvalidMessage for a bad size or value."""
    check_hidden_size(data, n, hidden_size, precision)
    arr = np.frombuffer(data, dtype=_DTYPES[precision]).reshape(n, hidden_size)
    if not np.isfinite(arr).all():
        raise InvalidMessage("hidden states: non-finite values")
    return arr.astype(np.float32)


class SessionStream:
    """Message frames over one stream, every write held ``delay_ms`` first."""

    def __init__(self, stream: BulkStream, delay_ms: float = 0.0) -> None:
        self.stream = stream
        self.delay_ms = delay_ms
        self._sending = trio.Lock()  # a stage's relays and replies may share one stream

    @property
    def peer_id(self) -> str:
        return self.stream.peer_id

    async def send(self, msg: Message, delay_ms: float = 0.0) -> None:
        """Write ``msg``, held ``delay_ms`` (or the stream's own delay when that is longer)."""
        data = encode(msg)
        delay = max(delay_ms, self.delay_ms)
        async with self._sending:
            if delay > 0:
                await trio.sleep(delay / 1000)  # the emulated link's one-way delay
            await write_frame(self.stream, data, max_bytes=MAX_FRAME_BYTES)

    async def receive(self) -> Message:
        """The next message; InvalidMessage for bytes that are none, TransportError for a
        broken or truncated stream, FrameTooLarge for an oversized frame."""
        return decode(await read_frame(self.stream, max_bytes=MAX_FRAME_BYTES))

    async def close(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self.stream.close()

    async def reset(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self.stream.reset()
