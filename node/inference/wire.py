"""Frames of an inference session on a libp2p stream, hidden-state codecs, link delay.

* Each frame is one length-prefixed message (node.transport's framing) of at most
  ``protocol.codec.MAX_FRAME_BYTES``; a larger announced frame is refused before its body.
* :func:`pack_hidden` / :func:`unpack_hidden` are the one pair of hidden-state codecs both ends
  use: fp16 (or fp32) little-endian, row-major (positions, hidden); ``unpack_hidden`` raises
  ``InvalidMessage`` for a wrong byte count or a non-finite value (the sender's fault).
* :class:`SessionStream` holds every outgoing frame for ``delay_ms`` before it writes it: a
  per-link delay for experiments (loopback has none, and a kernel without netem cannot add
  it). Off (0) by default. It reads the stream in chunks of up to ``READ_CHUNK`` bytes and
  cuts frames out of what it has, so a frame that arrived whole costs one read: each read of a
  libp2p stream makes yamux write a window update to the sender (encrypted, and the sender
  wakes to take it) before the data is handed over, and reading a frame's length and body
  apart cost two.
"""

from __future__ import annotations

import numpy as np
import trio

from node.transport import (
    FRAME_HEADER,
    BulkStream,
    FrameTooLarge,
    TransportError,
    write_frame,
)
from protocol.codec import MAX_FRAME_BYTES, Message, decode, encode
from protocol.errors import InvalidMessage
from protocol.inference.messages import Precision, check_hidden_size

_DTYPES = {Precision.FP16: np.dtype("<f2"), Precision.FP32: np.dtype("<f4")}
#: the most bytes one read of the stream asks for
READ_CHUNK = 1 << 16


#: model types (transformers' ``config.model_type``) whose hidden states leave f16's range
#: between stages (Gemma scales its embeddings by sqrt(hidden size) and its residual stream
#: grows past 65504), so "auto" sends them as f32
F16_UNSAFE_MODEL_TYPES = ("gemma",)


def wire_precision(setting: str, model_type: str) -> Precision:
    """The precision of hidden states on the wire for a model of ``model_type``."""
    if setting != "auto":
        return Precision(setting)
    return Precision.FP32 if model_type.startswith(F16_UNSAFE_MODEL_TYPES) else Precision.FP16


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
        self._sending = trio.Lock()  # a stage's handoffs and replies may share one stream
        self._buffer = bytearray()  # read, not yet cut into frames

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
        return decode(await self._frame())

    async def _frame(self) -> bytes:
        """The next frame's body; an announced size over the limit is refused before the
        rest of its body is waited for."""
        await self._fill(FRAME_HEADER.size)
        (size,) = FRAME_HEADER.unpack_from(self._buffer)
        if size > MAX_FRAME_BYTES:
            raise FrameTooLarge(size, MAX_FRAME_BYTES, "incoming frame")
        end = FRAME_HEADER.size + size
        await self._fill(end)
        body = bytes(self._buffer[FRAME_HEADER.size:end])
        del self._buffer[:end]
        return body

    async def _fill(self, n: int) -> None:
        """Read until ``n`` bytes are buffered; TransportError if the stream ends first."""
        while len(self._buffer) < n:
            chunk = await self.stream.read(max(READ_CHUNK, n - len(self._buffer)))
            if not chunk:
                raise TransportError(f"stream ended {n - len(self._buffer)} bytes short of a "
                                     f"{n}-byte frame")
            self._buffer += chunk

    async def close(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self.stream.close()

    async def reset(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await self.stream.reset()
