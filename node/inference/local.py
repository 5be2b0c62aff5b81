"""The local hop: this node's own stage in a chain it asks for, over an in-process stream.

A node that serves blocks [A, B) and asks for a chain plans its own offer like any other
(with a round trip of 0 ms: no link is crossed). libp2p does not open streams to oneself, so
:func:`local_pair` gives the two ends of an in-process ``BulkStream``: the requester's end
speaks the session protocol as it would to a remote server, the other end goes to the node's
own ``StageHost.serve`` as the opener's stream. Admission, limits, handoffs to the next stage
(over libp2p, signed with this node's key) and expiry are the same as for a remote requester.

Flow control as a network stream's: a write waits once ``WINDOW_WRITES`` writes are unread.
``close`` ends this end's sending side (the other reads ``b""``); ``reset`` ends both.
"""

from __future__ import annotations

import trio

from node.transport import StreamGone

#: unread writes one direction holds before a writer waits (a flow-control window: the session
#: protocol has one request and one reply in flight per session, a handoff at most one more)
WINDOW_WRITES = 16


class LocalStream:
    """One end of an in-process byte stream (``node.transport.BulkStream``)."""

    def __init__(self, inbound: trio.MemoryReceiveChannel[bytes],
                 outbound: trio.MemorySendChannel[bytes], peer: str) -> None:
        self._inbound, self._outbound, self._peer = inbound, outbound, peer
        self._buffer = b""

    @property
    def peer_id(self) -> str:
        return self._peer

    async def read(self, max_bytes: int) -> bytes:
        if not self._buffer:
            try:
                self._buffer = await self._inbound.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return b""
        out, self._buffer = self._buffer[:max_bytes], self._buffer[max_bytes:]
        return out

    async def write(self, data: bytes) -> None:
        if not data:
            return
        try:
            await self._outbound.send(bytes(data))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise StreamGone(f"local stream closed: {exc!r}") from exc

    async def close(self) -> None:
        await self._outbound.aclose()

    async def reset(self) -> None:
        await self._outbound.aclose()
        await self._inbound.aclose()


def local_pair(peer: str) -> tuple[LocalStream, LocalStream]:
    """(the requester's end, the server's end) of a stream from ``peer`` to itself."""
    to_server_send, to_server_receive = trio.open_memory_channel[bytes](WINDOW_WRITES)
    to_requester_send, to_requester_receive = trio.open_memory_channel[bytes](WINDOW_WRITES)
    return (LocalStream(to_requester_receive, to_server_send, peer),
            LocalStream(to_server_receive, to_requester_send, peer))
