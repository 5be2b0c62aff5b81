"""node/p2p/reqresp.py: request/response on reused streams, real libp2p hosts on 127.0.0.1.

Every wait is on an event, a stream's end or a fault report, bounded by a trio deadline.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from node.p2p.host import open_p2p
from node.runtime.limits import NetLimits
from node.transport import FRAME_HEADER, TransportError, read_frame, write_frame
from tests.node.trio_support import Faults, trio_test

ECHO = "/symphony/test-net/echo/1"
#: a server of the older kind: one exchange per stream, then it closes without reading more
ONE_SHOT = "/symphony/test-net/one-shot/1"


def seed(n: int) -> bytes:
    return hashlib.sha256(f"test-reqresp-{n}".encode()).digest()


async def echo(peer: str, data: bytes) -> bytes:
    return data


async def exchange(stream: Any, data: bytes) -> bytes:
    """One request/response on a raw stream, as a requester that keeps it open."""
    await write_frame(stream, data)
    with trio.fail_after(10):
        return await read_frame(stream, max_bytes=1 << 16)


async def ended(stream: Any) -> bytes:
    """What is left to read until the other side ends or resets the stream."""
    left = b""
    with trio.fail_after(10):
        try:
            while chunk := await stream.read(1024):
                left += chunk
        except TransportError:
            pass
    return left


@asynccontextmanager
async def echo_pair(limits: NetLimits | None = None) -> AsyncIterator[tuple[Any, Any, Faults]]:
    """(a, b, b's faults): b serves ``echo`` on ECHO under ``limits``, a is connected to it."""
    b_limits = {} if limits is None else {"limits": limits}
    async with open_p2p(seed(1)) as a, open_p2p(seed(2), **b_limits) as b:
        faults = Faults()
        b.set_fault_handler(faults)
        b.set_request_handler(ECHO, echo, max_request_bytes=100)
        await a.connect(b.listen_addrs()[0])
        yield a, b, faults


@trio_test
async def test_requests_share_one_stream_and_the_server_loop_serves_them_all() -> None:
    served: list[bytes] = []

    async def record(peer: str, data: bytes) -> bytes:
        served.append(data)
        return data[::-1]

    async with open_p2p(seed(1)) as a, open_p2p(seed(2)) as b:
        b.set_request_handler(ECHO, record, max_request_bytes=100)
        await a.connect(b.listen_addrs()[0])
        for i in range(100):
            request = f"request {i}".encode()
            assert await a.request(b.peer_id, ECHO, request, max_response_bytes=100) == (
                request[::-1])
        assert served == [f"request {i}".encode() for i in range(100)]  # each once, in order
        assert a.requests.counts == {"opened": 1, "reused": 99}
        assert a.requests.idle_count(b.peer_id, ECHO) == 1
        assert b.stream_faults == {}


@trio_test
async def test_a_stall_mid_frame_on_a_reused_stream_is_a_fault() -> None:
    async with echo_pair(NetLimits(read_deadline_s=0.3)) as (a, b, faults):
        for stuck in (FRAME_HEADER.pack(10) + b"abc", FRAME_HEADER.pack(10)[:2]):
            stream = await a.open_stream(b.peer_id, ECHO)
            assert await exchange(stream, b"fine") == b"fine"
            assert await exchange(stream, b"still fine") == b"still fine"
            await stream.write(stuck)  # a frame begun, never finished
            assert await ended(stream) == b""
        await faults.wait(2)
        assert faults.kinds == ["stall", "stall"]
        assert b.stream_faults == {"stall": 2}


@trio_test
async def test_an_oversize_frame_on_a_reused_stream_is_refused_before_its_body() -> None:
    async with echo_pair() as (a, b, faults):
        stream = await a.open_stream(b.peer_id, ECHO)
        assert await exchange(stream, b"x" * 100) == b"x" * 100
        await stream.write(FRAME_HEADER.pack(101))  # announced only: refused on the prefix
        assert await ended(stream) == b""
        await faults.wait(1)
        assert faults.kinds == ["oversize"]
        assert await a.request(b.peer_id, ECHO, b"after", max_response_bytes=10) == b"after"
        # on a pooled stream too; the write, still waiting for b's window when b resets the
        # stream, fails: no retry (b has read the prefix), one fault
        with pytest.raises(TransportError):
            await a.request(b.peer_id, ECHO, b"x" * (1 << 20), max_response_bytes=10)
        assert await a.request(b.peer_id, ECHO, b"still", max_response_bytes=10) == b"still"
        assert faults.kinds == ["oversize", "oversize"]
        assert a.requests.counts == {"opened": 2, "reused": 1}


@trio_test
async def test_inbound_request_streams_past_the_per_peer_cap_are_refused() -> None:
    async with echo_pair(NetLimits(max_streams_per_protocol=2)) as (a, b, faults):
        held = [await a.open_stream(b.peer_id, ECHO) for _ in range(2)]
        for stream in held:  # both served, both kept open by b's loop
            assert await exchange(stream, b"held") == b"held"
        with pytest.raises(TransportError):  # reset as the negotiation ends, or after
            extra = await a.open_stream(b.peer_id, ECHO)
            await write_frame(extra, b"one too many")
            await read_frame(extra, max_bytes=100)
        await faults.wait(1)
        assert faults.kinds == ["flood"]
        assert await exchange(held[0], b"the held ones still work") == b"the held ones still work"
        for stream in held:
            await stream.close()
            assert await ended(stream) == b""  # b's loop ends on our FIN and closes its side


@trio_test
async def test_a_request_cancelled_mid_flight_is_reset_not_pooled() -> None:
    entered, release = trio.Event(), trio.Event()

    async def slow_on_demand(peer: str, data: bytes) -> bytes:
        if data == b"slow":
            entered.set()
            await release.wait()
            return b"the slow answer"
        return data

    async with open_p2p(seed(1)) as a, open_p2p(seed(2)) as b:
        b.set_request_handler(ECHO, slow_on_demand, max_request_bytes=100)
        await a.connect(b.listen_addrs()[0])
        assert await a.request(b.peer_id, ECHO, b"warm", max_response_bytes=100) == b"warm"
        async with trio.open_nursery() as nursery:

            async def give_up_on_slow() -> None:
                with trio.CancelScope() as scope:
                    nursery.start_soon(entered_then_cancel, scope)
                    await a.request(b.peer_id, ECHO, b"slow", max_response_bytes=100)
                assert scope.cancelled_caught

            async def entered_then_cancel(scope: trio.CancelScope) -> None:
                await entered.wait()
                scope.cancel()

            nursery.start_soon(give_up_on_slow)
        release.set()  # b now answers on a stream a has reset
        # the next request must read its own answer, never the abandoned one
        assert await a.request(b.peer_id, ECHO, b"fast", max_response_bytes=100) == b"fast"
        assert await a.request(b.peer_id, ECHO, b"again", max_response_bytes=100) == b"again"
        assert a.requests.counts == {"opened": 2, "reused": 2}
        assert a.requests.idle_count(b.peer_id, ECHO) == 1


@trio_test
async def test_a_request_on_a_stream_the_server_closed_unread_is_sent_once_more() -> None:
    """The retry rule: the older server (or one closing an idle stream) ends the stream
    between exchanges without reading; the request goes out again on a fresh stream, and
    reaches the handler once."""
    may_close = trio.Event()
    handled: list[bytes] = []

    async def one_shot(peer: str, stream: Any) -> None:
        request = await read_frame(stream, max_bytes=100)
        handled.append(request)
        await write_frame(stream, request)
        await may_close.wait()  # then closes, reading nothing more

    async with open_p2p(seed(1)) as a, open_p2p(seed(2)) as b:
        b.set_stream_handler(ONE_SHOT, one_shot)
        await a.connect(b.listen_addrs()[0])
        assert await a.request(b.peer_id, ONE_SHOT, b"first", max_response_bytes=100) == (
            b"first")
        assert a.requests.idle_count(b.peer_id, ONE_SHOT) == 1  # still open: b waits
        async with trio.open_nursery() as nursery:
            second: list[bytes] = []

            async def send_second() -> None:
                second.append(await a.request(b.peer_id, ONE_SHOT, b"second",
                                              max_response_bytes=100))

            nursery.start_soon(send_second)  # takes the pooled stream in its first step
            may_close.set()
        assert second == [b"second"]
        assert handled == [b"first", b"second"]
        assert a.requests.counts == {"opened": 2, "reused": 1, "retried": 1}


@trio_test
async def test_idle_streams_are_closed_by_both_sides_without_fault() -> None:
    async with echo_pair(NetLimits(idle_timeout_s=0.2)) as (a, b, faults):
        # the server: a stream silent between exchanges past its idle limit gets a FIN
        stream = await a.open_stream(b.peer_id, ECHO)
        assert await exchange(stream, b"then silence") == b"then silence"
        assert await ended(stream) == b""
        # the requester: its pool closes streams idle past its own limit
        assert await a.request(b.peer_id, ECHO, b"pooled", max_response_bytes=100) == b"pooled"
        assert await a.requests.close_idle(trio.current_time()) == 0  # not idle for long yet
        assert await a.requests.close_idle(trio.current_time() + 3600) == 1
        assert a.requests.idle_count(b.peer_id, ECHO) == 0
        assert await a.request(b.peer_id, ECHO, b"fresh", max_response_bytes=100) == b"fresh"
        assert a.requests.counts == {"opened": 2, "closed_idle": 1}
        assert faults.seen == [] and b.stream_faults == {}


def test_frame_limits_are_checked_by_the_pool() -> None:
    async def main() -> None:
        async with open_p2p(seed(1)) as a:
            with pytest.raises(ValueError):
                await a.request(a.peer_id, ECHO, b"", max_response_bytes=-1)

    trio.run(main)
