"""node/p2p/shaping.py on loopback: measured round trips and rates match the link's settings.

The point of these tests is the measured-versus-set check, so they read the clock: each
figure must land within ``TOLERANCE`` of the setting. Round trips are the median of several
pings (one late wake-up on a loaded machine does not move it), less the median round trip of
the same stack with no delay set, measured just before: what the link adds is compared with
what was set, not the machine's own scheduling latency. Transfers are large enough that the
cap, not the stack's own speed, sets their time. Both ends are shaped, as in a testnet where
every daemon runs the same ``--link``.
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
from libp2p.io.exceptions import ConnectionClosedError
from libp2p.io.trio import TrioTCPStream

from node.p2p.host import open_p2p
from node.p2p.link import LinkSpec, parse_link
from node.p2p.shaping import ShapedStream
from node.transport import BulkStream

#: how far a measured figure may sit from its setting
TOLERANCE = 0.10
PINGS = 9
TEST_DEADLINE_S = 60
ECHO = "/symphony/test-net/echo/1"
SINK = "/symphony/test-net/sink/1"


def run(test: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        with trio.fail_after(TEST_DEADLINE_S):
            await test()

    trio.run(bounded)


def assert_near(measured: float, setting: float, what: str) -> None:
    print(f"{what}: measured {measured:.4g}, set {setting:.4g}")  # shown with -s
    assert abs(measured - setting) <= TOLERANCE * setting, \
        f"{what}: measured {measured:.4g}, set {setting:.4g}"


@asynccontextmanager
async def shaped_pair(a: LinkSpec, b: LinkSpec) -> AsyncIterator[tuple[ShapedStream,
                                                                        ShapedStream]]:
    """Two ends of one loopback TCP connection, each behind its own link."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        dialed = await trio.open_tcp_stream("127.0.0.1", port)
        accepted = await listeners[0].accept()
        await listeners[0].aclose()
        yield (ShapedStream(TrioTCPStream(dialed), a, random.Random(1), nursery),
               ShapedStream(TrioTCPStream(accepted), b, random.Random(2), nursery))
        nursery.cancel_scope.cancel()


async def ping_floor(write: Callable[[bytes], Awaitable[None]],
                     read: Callable[[], Awaitable[bytes]]) -> float:
    """The fastest of PINGS round trips: the link sets a floor, and a busy machine's late
    wake-ups only ever add to it, so the minimum is the measurement that reads the link."""
    rtts = []
    for _ in range(PINGS):
        started = trio.current_time()
        await write(b"p")
        assert await read() == b"p"
        rtts.append(trio.current_time() - started)
    return min(rtts)


async def receive_rate(read: Callable[[], Awaitable[bytes]], total: int) -> float:
    """Bits per second from the first byte's arrival to the last one's."""
    got = len(await read())
    first_at = trio.current_time()
    first = got
    while got < total:
        data = await read()
        assert data, "the stream ended early"
        got += len(data)
    return (got - first) * 8 / (trio.current_time() - first_at)


async def send_all(stream: ShapedStream, total: int, chunk: int = 1 << 16) -> None:
    assert total % chunk == 0
    data = os.urandom(chunk)
    for _ in range(total // chunk):
        await stream.write(data)


async def echo_rtt(a: LinkSpec, b: LinkSpec) -> float:
    """The median ping round trip over a shaped pair, b echoing."""
    async with shaped_pair(a, b) as (near, far), trio.open_nursery() as nursery:
        async def echo() -> None:
            while data := await far.read(64):
                await far.write(data)

        nursery.start_soon(echo)
        rtt = await ping_floor(near.write, lambda: near.read(64))
        nursery.cancel_scope.cancel()
    return rtt


@pytest.mark.parametrize("rtt_ms", [60, 120])
def test_a_shaped_connection_adds_the_set_round_trip(rtt_ms: int) -> None:
    async def test() -> None:
        baseline = await echo_rtt(LinkSpec(), LinkSpec())
        spec = LinkSpec(rtt_s=rtt_ms / 1000)
        assert_near(await echo_rtt(spec, spec) - baseline, rtt_ms / 1000, "rtt")

    run(test)


@pytest.mark.parametrize(("a_spec", "b_spec", "rate_bps"), [
    ("rtt=60ms,up=20mbit", "rtt=60ms,up=20mbit", 20e6),  # the sender's up caps it
    ("up=50mbit", "up=50mbit,down=16mbit", 16e6),  # the receiver's lower down caps it
])
def test_a_transfer_runs_at_the_set_rate(a_spec: str, b_spec: str, rate_bps: float) -> None:
    a_link, b_link = parse_link(a_spec), parse_link(b_spec)
    assert a_link is not None and b_link is not None
    total = round(rate_bps / 8 * 1.2) >> 16 << 16  # whole 64 KiB chunks, about 1.2 s at the cap

    async def test() -> None:
        async with shaped_pair(a_link, b_link) as (a, b), trio.open_nursery() as nursery:
            nursery.start_soon(send_all, a, total)
            assert_near(await receive_rate(lambda: b.read(1 << 16), total), rate_bps, "rate")

    run(test)


def test_a_broken_socket_fails_the_writer_instead_of_hanging_it() -> None:
    async def test() -> None:
        spec = LinkSpec(rtt_s=0.01)
        async with shaped_pair(spec, spec) as (a, b):
            await b.close()
            await b.read(1)  # b's socket is closed once its delivery task sees the close
            with pytest.raises(ConnectionClosedError):  # RST from the closed end, then refused
                for _ in range(1000):
                    await a.write(b"x" * 65536)

    run(test)


async def libp2p_echo_rtt(link: LinkSpec | None) -> float:
    async with open_p2p(os.urandom(32), link=link) as a, open_p2p(os.urandom(32), link=link) as b:
        async def echo(peer: str, stream: BulkStream) -> None:
            while data := await stream.read(64):
                await stream.write(data)

        b.set_stream_handler(ECHO, echo)
        await a.connect(b.listen_addrs()[0])
        pings = await a.open_stream(b.peer_id, ECHO)
        return await ping_floor(pings.write, lambda: pings.read(64))


def test_two_shaped_libp2p_hosts_see_the_link_on_their_streams() -> None:
    """Noise, yamux and our streams over the shaper: an echo round trip takes the rtt more
    than over unshaped hosts, and a bulk stream runs at the sender's up."""
    link = parse_link("rtt=60ms,up=20mbit")
    total = 3 << 20  # 1.26 s at 20 Mbit/s

    async def test() -> None:
        baseline = await libp2p_echo_rtt(None)
        assert_near(await libp2p_echo_rtt(link) - baseline, 0.06, "rtt")
        async with open_p2p(os.urandom(32), link=link) as a, \
                open_p2p(os.urandom(32), link=link) as b:
            rates: list[float] = []

            async def sink(peer: str, stream: BulkStream) -> None:
                rates.append(await receive_rate(lambda: stream.read(1 << 16), total))

            b.set_stream_handler(SINK, sink)
            await a.connect(b.listen_addrs()[0])
            bulk = await a.open_stream(b.peer_id, SINK)
            await bulk.write(os.urandom(total))
            await bulk.close()
            while await bulk.read(1):  # the sink closes its side once it has all
                pass
            assert_near(rates[0], 20e6, "rate")

    run(test)
