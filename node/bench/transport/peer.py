"""A libp2p peer in its own process, for `symphony bench transport` and the transport tests.

``python -m node.bench.transport.peer PREFIX`` starts a :class:`node.p2p.host.P2PTransport` on
127.0.0.1 (port 0) and a raw TCP sink, prints one JSON line ``{"addr", "peer_id",
"tcp_port"}`` on stdout, and serves until its stdin closes (so it dies with its parent):

* ``PREFIX/echo/1``: request/response, echoes the request.
* ``PREFIX/sink/1``: bulk stream, reads to EOF, answers the byte count (8 bytes, big-endian).
* ``PREFIX/stats/1``: request/response, answers JSON ``{"latencies_ns": [...]}`` for the
  gossip received so far on topic ``PREFIX/gossip``, where each message starts with the
  sender's ``time.monotonic_ns()`` (8 bytes; CLOCK_MONOTONIC is shared by all processes of
  one Linux machine).
* raw TCP on ``tcp_port``: reads to EOF, answers the byte count, like the sink.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from functools import partial

import structlog
import trio

from node.p2p.host import P2PTransport
from node.transport import BulkStream

READ_CHUNK = 256 * 1024
MAX_ECHO_BYTES = 1 << 20


async def serve(prefix: str) -> None:
    transport = P2PTransport(os.urandom(32))
    latencies_ns: list[int] = []

    async def echo(peer: str, data: bytes) -> bytes:
        return data

    async def stats(peer: str, data: bytes) -> bytes:
        return json.dumps({"latencies_ns": latencies_ns}).encode()

    async def sink(peer: str, stream: BulkStream) -> None:
        total = 0
        while chunk := await stream.read(READ_CHUNK):
            total += len(chunk)
        await stream.write(total.to_bytes(8, "big"))

    async def tcp_sink(conn: trio.SocketStream) -> None:
        total = 0
        while chunk := await conn.receive_some(READ_CHUNK):
            total += len(chunk)
        await conn.send_all(total.to_bytes(8, "big"))
        await conn.aclose()

    async def gossip(messages: trio.abc.ReceiveChannel[tuple[str, bytes]]) -> None:
        async for _peer, data in messages:
            latencies_ns.append(time.monotonic_ns() - int.from_bytes(data[:8], "big"))

    transport.set_request_handler(f"{prefix}/echo/1", echo, max_request_bytes=MAX_ECHO_BYTES)
    transport.set_request_handler(f"{prefix}/stats/1", stats, max_request_bytes=16)
    transport.set_stream_handler(f"{prefix}/sink/1", sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(transport.run)
        listeners = await nursery.start(partial(trio.serve_tcp, tcp_sink, 0, host="127.0.0.1"))
        nursery.start_soon(gossip, await transport.subscribe(f"{prefix}/gossip"))
        line = {
            "addr": transport.listen_addrs()[0],
            "peer_id": transport.peer_id,
            "tcp_port": listeners[0].socket.getsockname()[1],
        }
        print(json.dumps(line), flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        while await stdin.receive_some(1024):
            pass
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    # stdout carries the one JSON line; logs go to stderr, warnings and up.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )
    trio.run(serve, sys.argv[1])
