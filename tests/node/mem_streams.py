"""In-memory byte streams for the state-stream tests: a pipe and the BulkStream over it."""

from __future__ import annotations

import trio


class Pipe:
    """One direction of an in-memory byte stream."""

    def __init__(self) -> None:
        self.send, self.recv = trio.open_memory_channel[bytes](1000)
        self.buf = b""


class MemStream:
    """A BulkStream that reads from one pipe and writes to the other."""

    def __init__(self, inbound: Pipe, outbound: Pipe, peer: str) -> None:
        self.inbound, self.outbound, self._peer = inbound, outbound, peer

    @property
    def peer_id(self) -> str:
        return self._peer

    async def read(self, max_bytes: int) -> bytes:
        if not self.inbound.buf:
            try:
                self.inbound.buf = await self.inbound.recv.receive()
            except trio.EndOfChannel:
                return b""
        out, self.inbound.buf = self.inbound.buf[:max_bytes], self.inbound.buf[max_bytes:]
        return out

    async def write(self, data: bytes) -> None:
        await self.outbound.send.send(data)

    async def close(self) -> None:
        await self.outbound.send.aclose()

    async def reset(self) -> None:
        await self.outbound.send.aclose()
