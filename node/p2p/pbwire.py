"""Varint-length-delimited protobuf messages, as AutoNAT, circuit relay v2 and DCUtR frame them.

Every byte read here is a peer's: :func:`read_message` reads the unsigned-varint length one
byte at a time (at most ``MAX_VARINT_BYTES``), refuses a length over ``max_bytes`` before
reading the body (``PeerFault("oversize")``), a stream that ends inside a frame
(``"bad_framing"``) and, through protobuf, bytes that are no message of the expected type
(``DecodeError``, which the guard counts as "undecodable"). The caller bounds the time (a
cancel scope); :func:`read_message` never waits on its own. Messages are proto2/proto3
objects from py-libp2p's generated modules (the specs' own schemas).

The three specs cap an encoded message at 4 KiB (``MAX_MESSAGE_BYTES``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import trio
from google.protobuf.message import DecodeError, Message

from node.p2p.framing import PeerFault

#: the specs' limit on one encoded message (length prefix excluded)
MAX_MESSAGE_BYTES = 4096
#: a length prefix longer than this cannot describe an allowed length anyway
MAX_VARINT_BYTES = 3

M = TypeVar("M", bound=Message)


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"a varint is unsigned, got {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def frame(message: Message) -> bytes:
    """``message`` with its varint length prefix."""
    body = message.SerializeToString()
    return encode_varint(len(body)) + body


async def _read_exact(stream: Any, n: int, what: str) -> bytes:
    parts, missing = [], n
    while missing:
        try:
            chunk = await stream.read(missing)
        except EOFError:
            chunk = b""
        if not chunk:
            raise PeerFault("bad_framing", f"the stream ended {missing} bytes into {what}")
        parts.append(chunk)
        missing -= len(chunk)
    return b"".join(parts)


async def read_length(stream: Any, max_bytes: int) -> int:
    """The next frame's length; a fault for an over-long prefix or a length over the limit."""
    value = 0
    for i in range(MAX_VARINT_BYTES):
        (byte,) = await _read_exact(stream, 1, "a length prefix")
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value > max_bytes:
                raise PeerFault("oversize", f"a {value}-byte message (limit {max_bytes})")
            return value
    raise PeerFault("oversize", f"a length prefix over {MAX_VARINT_BYTES} bytes")


def parse(cls: type[M], body: bytes) -> M:
    """``body`` as a ``cls`` message; ``DecodeError`` (the peer's fault) when it is not one."""
    message = cls()
    message.ParseFromString(body)
    missing = message.FindInitializationErrors()
    if missing:  # proto2 "required" fields: ParseFromString lets them pass unset
        raise DecodeError(f"{cls.__name__} lacks required field(s) {', '.join(missing)}")
    return message


async def read_message(stream: Any, cls: type[M], *, max_bytes: int = MAX_MESSAGE_BYTES) -> M:
    """One length-delimited ``cls`` message from ``stream``; see the module doc for faults."""
    size = await read_length(stream, max_bytes)
    return parse(cls, await _read_exact(stream, size, f"a {size}-byte message"))


async def read_message_or_end(stream: Any, cls: type[M], *,
                              max_bytes: int = MAX_MESSAGE_BYTES) -> M | None:
    """Like :func:`read_message`, but None when the stream ends before a new message starts
    (the peer had nothing more to say: no fault)."""
    try:
        first = await stream.read(1)
    except EOFError:
        first = b""
    if not first:
        return None
    return await read_message(_Prepended(first, stream), cls, max_bytes=max_bytes)


class _Prepended:
    """``stream`` with bytes already read put back in front."""

    def __init__(self, head: bytes, stream: Any) -> None:
        self._head, self._stream = head, stream

    async def read(self, n: int) -> bytes:
        if self._head:
            out, self._head = self._head[:n], self._head[n:]
            return out
        return bytes(await self._stream.read(n))


async def write_message(stream: Any, message: Message) -> None:
    await stream.write(frame(message))


async def close_quietly(stream: Any) -> None:
    """Close ``stream`` at the end of an exchange, even while cancelled; one the peer has
    already closed or reset is gone already, which is no fault."""
    with trio.CancelScope(shield=True):
        try:
            await stream.close()
        except Exception:
            pass
