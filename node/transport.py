"""The transport interface that the daemon codes against.

Everything in node/ that talks to other peers goes through a :class:`Transport`; only
``node/p2p/`` implements it over py-libp2p, and ``simulations/`` implements it in memory.
Nothing here mentions libp2p: peer ids, protocol ids and topics are ``str``, payloads are
``bytes``, so an implementation can never leak its own types.

Contract (what every implementation promises)
---------------------------------------------
``peer_id``
    This node's libp2p peer id, base58btc ("12D3KooW..."): the identity multihash of the
    protobuf-encoded Ed25519 public key (see ``crypto/peer_id.py``).
``listen_addrs() -> list[str]``
    Full multiaddrs that peers can dial, each ending in ``/p2p/<peer_id>``, with the port
    actually bound (never ``/tcp/0``). Only meaningful while the transport runs.
``await listen_addrs_changed(seen) -> list[str]``
    Returns ``listen_addrs()`` once it differs from ``seen`` (at once if it already does):
    the event services that announce our addresses wait on, rather than polling.
``await connect(multiaddr) -> str``
    ONE dial attempt to a multiaddr that names its peer (``.../p2p/<id>``); returns that peer
    id once the connection is usable. Fails with :class:`TransportError` in bounded time
    (a refused port, a wrong peer id behind the address, a handshake failure, dialing
    oneself). No retries, no backoff: the daemon's membership machine decides when to dial.
``await disconnect(peer_id)``
    Closes every connection to the peer; a no-op if there is none.
``connected_peers() -> list[str]``
    Peers with at least one open connection; consistent with the events below.
``peer_events() -> trio.abc.ReceiveChannel[PeerEvent]``
    One channel, for one consumer (the daemon). Events are produced only after the first
    call. ``PeerEvent(peer, True)`` when the first connection to a peer opens,
    ``PeerEvent(peer, False)`` when the last one closes, including when the peer dies
    (kill -9 surfaces as a disconnect once the TCP connection breaks). Events are never
    dropped: a consumer that stops reading eventually stalls new connections (bounded
    channel, backpressure), so the daemon must keep draining it.
``set_request_handler(protocol_id, handler, *, max_request_bytes)``
    Serve length-prefixed request/response on ``protocol_id``: the handler gets
    ``(peer_id, request_bytes)`` and returns the response bytes, once per request (a stream
    may carry many requests, one after another). A request frame longer than
    ``max_request_bytes`` is refused before its body is read. A peer that sends garbage, an
    oversized or truncated frame, or whose handler raises, gets its stream reset; the error is
    logged with the peer id and the node keeps serving everyone else.
``await request(peer_id, protocol_id, data, *, max_response_bytes) -> bytes``
    Send one request frame and return the response frame. Raises :class:`FrameTooLarge` if the
    response announces more than ``max_response_bytes`` (checked before reading the body) and
    :class:`TransportError` for any other failure (no connection, protocol unsupported, reset,
    truncated response). Timeouts are the caller's: wrap the call in ``trio.fail_after``; a
    call cancelled or failed part-way leaves nothing behind that a later request could read.
    The handler sees each request at most once per call (an implementation that retries does
    so only when the peer cannot have read the request).
``await subscribe(topic) -> trio.abc.ReceiveChannel[tuple[str, bytes]]``
    Gossip messages on ``topic`` as ``(origin_peer_id, data)``, own publishes excluded.
    Subscribing twice to one topic is an error (:class:`TransportError`).
``await publish(topic, data)``
    Gossip ``data`` on ``topic``; may wait to stay within the implementation's publish rate.
``await wait_topic_peer(topic, peer_id)``
    Return once ``peer_id`` is a gossip neighbour on ``topic`` (so a publish reaches it).
    Bounded by the caller's cancel scope. Tests and the daemon's readiness checks use it
    instead of sleeping.
``set_stream_handler(protocol_id, handler)`` / ``await open_stream(peer_id, protocol_id)``
    Raw, backpressured byte streams (weight relay): :class:`BulkStream` below. A handler's
    stream is closed for it when the handler returns; an exception in a handler resets the
    stream and is logged, never propagated.
``set_fault_handler(handler)``
    ``handler(peer_id, kind, detail)`` is called for each fault a peer commits on an inbound
    stream of any protocol the node serves: ``kind`` is a key of
    ``node.penalties.FAULT_PENALTIES`` (bad framing, oversize, stall, undecodable, invalid,
    flood). A handler raising ``ProtocolViolation`` or ``RemoteProtocolError`` is an
    "invalid" fault, undecodable bytes (``InvalidMessage``) "undecodable", a timeout "stall",
    an oversized or truncated frame "oversize" / "bad_framing"; a stream the peer reset or
    closed (``StreamGone``) is no fault.

Framing
-------
Request/response frames are a 4-byte big-endian unsigned length followed by that many bytes
(:func:`write_frame` / :func:`read_frame`). A stream carries request/response exchanges one
after another: one request frame, then its response frame, then maybe the next request (never
two requests in flight on one stream). Either side may end the stream between exchanges; a
requester may also send one request and close (node/p2p/reqresp.py says how the libp2p
transport reuses streams, and when it closes them).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

import trio

#: Length prefix of every request/response frame: 4 bytes, big-endian, unsigned.
FRAME_HEADER = struct.Struct(">I")
#: The largest frame the 4-byte prefix can describe; limits passed in may not exceed it.
MAX_FRAME_BYTES = 2**32 - 1


@functools.cache
def agent_version() -> str:
    """What this node says it is, to peers (identify, Hello): ``symphony-node/<version>``.
    Read from the package metadata once: the ledger asks for it at every capability poll."""
    try:
        return f"symphony-node/{version('symphony-node')}"
    except PackageNotFoundError:
        return "symphony-node/dev"


class TransportError(Exception):
    """A transport operation failed (dial, stream, request); says what and with whom."""


class StreamGone(TransportError):
    """The stream was reset or closed under us: the peer went away, no fault of its bytes."""


class ProtocolViolation(Exception):
    """A stream handler's peer broke the stream's protocol (the transport penalizes it)."""


class FrameTooLarge(TransportError):
    """A frame announced (or a caller tried to send) more bytes than the limit allows."""

    def __init__(self, size: int, limit: int, what: str = "frame") -> None:
        super().__init__(f"{what} of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class PeerEvent:
    """A peer became connected (first connection) or disconnected (last connection gone)."""

    peer_id: str
    connected: bool


class BulkStream(Protocol):
    """A bidirectional byte stream to one peer, with flow control (writes wait for the reader).

    ``read(max_bytes)`` returns 1..max_bytes bytes, or ``b""`` once the peer has closed its
    sending side. ``write`` raises :class:`TransportError` if the stream is gone. ``close()``
    ends our sending side (the peer reads ``b""``) and releases the stream once both sides are
    done; ``reset()`` aborts both directions at once.
    """

    @property
    def peer_id(self) -> str: ...

    async def read(self, max_bytes: int) -> bytes: ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...

    async def reset(self) -> None: ...


RequestHandler = Callable[[str, bytes], Awaitable[bytes]]
StreamHandler = Callable[[str, BulkStream], Awaitable[None]]
#: (peer_id, fault kind, detail) -> None
FaultHandler = Callable[[str, str, str], None]


class Transport(Protocol):
    """See the module docstring for the contract of each member."""

    @property
    def peer_id(self) -> str: ...

    def listen_addrs(self) -> list[str]: ...

    async def listen_addrs_changed(self, seen: Sequence[str]) -> list[str]: ...

    async def connect(self, multiaddr: str) -> str: ...

    async def disconnect(self, peer_id: str) -> None: ...

    def connected_peers(self) -> list[str]: ...

    def peer_events(self) -> trio.abc.ReceiveChannel[PeerEvent]: ...

    def set_request_handler(
        self, protocol_id: str, handler: RequestHandler, *, max_request_bytes: int
    ) -> None: ...

    async def request(
        self, peer_id: str, protocol_id: str, data: bytes, *, max_response_bytes: int
    ) -> bytes: ...

    async def subscribe(self, topic: str) -> trio.abc.ReceiveChannel[tuple[str, bytes]]: ...

    async def publish(self, topic: str, data: bytes) -> None: ...

    async def wait_topic_peer(self, topic: str, peer_id: str) -> None: ...

    def set_stream_handler(self, protocol_id: str, handler: StreamHandler) -> None: ...

    async def open_stream(self, peer_id: str, protocol_id: str) -> BulkStream: ...

    def set_fault_handler(self, handler: FaultHandler) -> None: ...


def check_limit(limit: int) -> None:
    """Raise ValueError for a frame limit the 4-byte prefix cannot express (our own misuse)."""
    if not 0 <= limit <= MAX_FRAME_BYTES:
        raise ValueError(f"frame limit must be within 0..{MAX_FRAME_BYTES}, got {limit}")


async def write_frame(stream: BulkStream, data: bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> None:
    """Write one length-prefixed frame; FrameTooLarge if ``data`` is longer than ``max_bytes``."""
    if len(data) > max_bytes:
        raise FrameTooLarge(len(data), max_bytes, "outgoing frame")
    await stream.write(FRAME_HEADER.pack(len(data)) + data)


async def read_exactly(stream: BulkStream, n: int) -> bytes:
    """Read exactly ``n`` bytes; TransportError if the stream ends first."""
    parts: list[bytes] = []
    missing = n
    while missing:
        chunk = await stream.read(missing)
        if not chunk:
            raise TransportError(f"stream ended {missing} bytes short of a {n}-byte read")
        parts.append(chunk)
        missing -= len(chunk)
    return b"".join(parts)


async def read_frame(stream: BulkStream, *, max_bytes: int) -> bytes:
    """Read one length-prefixed frame, refusing one longer than ``max_bytes`` before its body.

    Raises FrameTooLarge for an oversized length, TransportError for a truncated frame, and
    StreamGone (no one's fault) for a stream that ends before a frame begins: its opener went
    away or gave up before it wrote (a request cancelled by its caller's deadline, a peer
    killed), which is no framing fault of the peer.
    """
    check_limit(max_bytes)
    first = await stream.read(FRAME_HEADER.size)
    if not first:
        raise StreamGone("the stream ended before a frame began")
    return await finish_frame(stream, first, max_bytes=max_bytes)


async def finish_frame(stream: BulkStream, first: bytes, *, max_bytes: int) -> bytes:
    """The rest of a frame whose first 1..4 bytes (``first``, from a read of at most
    ``FRAME_HEADER.size``) were already read: for a reader that waits for a frame to begin
    under another deadline than the one the frame must complete in. Errors as ``read_frame``."""
    check_limit(max_bytes)
    header = first + await read_exactly(stream, FRAME_HEADER.size - len(first))
    (size,) = FRAME_HEADER.unpack(header)
    if size > max_bytes:
        raise FrameTooLarge(size, max_bytes, "incoming frame")
    return await read_exactly(stream, size)
