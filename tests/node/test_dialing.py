"""node/runtime/dialing.py: a peer's addresses dialed side by side, the first to connect wins.

The schedule is tested in trio's MockClock (virtual time, dials that take a set time); the
last tests dial a real libp2p host on loopback: one whose first address never answers, and
one dialed twice at once, both dials finishing (one connection is kept). The
same race against a node behind a NAT: tests/node/test_nat_dialing.py.
"""

from __future__ import annotations

import functools
import os

import trio
import trio.testing
from libp2p.peer.id import ID

from node.p2p.host import open_p2p
from node.runtime.dialing import DIAL_STAGGER_S, dial_first, dial_plan
from node.transport import TransportError

PEER = "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
OTHER = "12D3KooWBVbaT3Pk3CmnxjVCkbpkBUFs7VzVdSJoV2SyqBfzxoHg"
ECHO = "/symphony/test/echo/1"


def run_virtual(test: functools.partial[object] | object) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


class FakeDials:
    """``connect`` for addresses named "<outcome>:<seconds>": ok, fail, or hang (until
    cancelled); logs (virtual time, event, addr)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []

    async def connect(self, addr: str) -> None:
        outcome, _, seconds = addr.partition(":")
        self.events.append((trio.current_time(), "start", addr))
        try:
            await trio.sleep(float(seconds) if outcome != "hang" else 1e9)
        except trio.Cancelled:
            self.events.append((trio.current_time(), "cancelled", addr))
            raise
        if outcome == "fail":
            self.events.append((trio.current_time(), "failed", addr))
            raise TransportError(f"dial {addr} refused")
        if outcome == "mute":  # a failure whose message does not name the address
            raise TransportError("relay refused a circuit: NO_RESERVATION")
        self.events.append((trio.current_time(), "connected", addr))


def test_a_hanging_first_address_gives_way_to_the_next_after_the_stagger() -> None:
    async def test() -> None:
        dials = FakeDials()
        outcome = await dial_first(dials.connect, ["hang:", "ok:0.3", "ok:0.1"])
        assert outcome.addr == "ok:0.3" and outcome.errors == ()
        s = DIAL_STAGGER_S
        assert dials.events[:4] == [
            (0.0, "start", "hang:"),
            (s, "start", "ok:0.3"),
            (2 * s, "start", "ok:0.1"),
            (s + 0.3, "connected", "ok:0.3"),  # first to connect, though not the fastest dial
        ]
        # the rest are cancelled then (in trio's order, which it shuffles on purpose)
        assert sorted(dials.events[4:]) == [(s + 0.3, "cancelled", "hang:"),
                                            (s + 0.3, "cancelled", "ok:0.1")]

    run_virtual(test)


def test_a_failure_starts_the_next_address_at_once_and_all_failures_are_reported() -> None:
    async def test() -> None:
        dials = FakeDials()
        outcome = await dial_first(dials.connect, ["fail:0.01", "fail:0.02", "ok:0.05"])
        assert outcome.addr == "ok:0.05"
        assert outcome.errors == ("dial fail:0.01 refused", "dial fail:0.02 refused")
        starts = [t for t, event, _ in dials.events if event == "start"]
        assert starts == [0.0, 0.01, 0.03]
        dials = FakeDials()
        outcome = await dial_first(dials.connect, ["fail:1", "fail:0.1"])
        assert outcome.addr is None
        # the second failed first; both are reported, neither dial is retried
        assert outcome.errors == ("dial fail:0.1 refused", "dial fail:1 refused")
        assert await dial_first(dials.connect, []) == type(outcome)(None, ())
        # every failure names its address, the transport's message or not
        outcome = await dial_first(dials.connect, ["mute:0.1", "fail:0.2"])
        assert outcome.errors == ("mute:0.1: relay refused a circuit: NO_RESERVATION",
                                  "dial fail:0.2 refused")

    run_virtual(test)


def test_a_failure_while_an_earlier_dial_still_runs_waits_for_the_stagger() -> None:
    async def test() -> None:
        dials = FakeDials()
        await dial_first(dials.connect, ["ok:1", "fail:0.01", "ok:0.01"])
        starts = [(t, addr) for t, event, addr in dials.events if event == "start"]
        assert starts == [(0.0, "ok:1"), (DIAL_STAGGER_S, "fail:0.01"),
                          (2 * DIAL_STAGGER_S, "ok:0.01")]

    run_virtual(test)


def test_the_plan_names_the_peer_and_puts_relayed_addresses_last() -> None:
    relay = f"/ip4/10.0.0.9/tcp/4001/p2p/{OTHER}/p2p-circuit/p2p/{PEER}"
    plan, errors = dial_plan(PEER, [
        relay, "/ip4/192.168.1.5/tcp/4001", f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER}",
        f"/ip4/5.6.7.8/tcp/4001/p2p/{OTHER}"])
    assert plan == [f"/ip4/192.168.1.5/tcp/4001/p2p/{PEER}",
                    f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER}", relay]
    assert errors == [f"/ip4/5.6.7.8/tcp/4001/p2p/{OTHER}: names another peer"]


async def _silent_listener(nursery: trio.Nursery, accepted: list[trio.SocketStream],
                           closed: trio.Event) -> int:
    """A TCP port that accepts and then never says a word: a dial to it hangs in the
    handshake until the dialer gives up. ``closed`` is set when the dialer hangs up."""

    async def hold(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        while await stream.receive_some(4096):
            pass  # the dialer's Noise/multistream hello: never answered
        closed.set()

    listeners = await nursery.start(functools.partial(trio.serve_tcp, hold, 0, host="127.0.0.1"))
    return int(listeners[0].socket.getsockname()[1])


def test_a_peer_whose_first_address_never_answers_is_reached_through_the_second() -> None:
    dial_timeout_s = 20.0  # the dial to the silent address would give up only after this

    async def test() -> None:
        async with open_p2p(os.urandom(32), dial_timeout_s=dial_timeout_s) as a, \
                open_p2p(os.urandom(32)) as b, trio.open_nursery() as nursery:
            accepted: list[trio.SocketStream] = []
            hung_up = trio.Event()
            port = await _silent_listener(nursery, accepted, hung_up)
            silent = f"/ip4/127.0.0.1/tcp/{port}/p2p/{b.peer_id}"
            good = b.listen_addrs()[0]
            outcome = await dial_first(a.connect, [silent, good])
            # no error: the silent dial neither failed nor timed out before the good one won
            assert outcome.addr == good and outcome.errors == ()
            assert b.peer_id in a.connected_peers()
            assert len(accepted) == 1  # the silent address was dialed, and first
            await hung_up.wait()  # that dial was cancelled, not left to time out
            nursery.cancel_scope.cancel()

    async def bounded() -> None:
        with trio.fail_after(dial_timeout_s):  # a hang fails the test, never stalls the suite
            await test()

    trio.run(bounded)


def test_two_dials_to_one_peer_that_both_connect_leave_one_connection() -> None:
    async def test() -> None:
        async with open_p2p(os.urandom(32)) as a, open_p2p(os.urandom(32)) as b:
            addr = b.listen_addrs()[0]

            async def echo(peer: str, data: bytes) -> bytes:
                return data

            b.set_request_handler(ECHO, echo, max_request_bytes=8)
            done: list[str] = []

            async def connect(addr: str) -> None:
                done.append(await a.connect(addr))

            async with trio.open_nursery() as nursery:  # neither is cancelled: both connect
                nursery.start_soon(connect, addr)  # as two addresses of one peer would
                nursery.start_soon(connect, addr)
            assert done == [b.peer_id, b.peer_id]
            conns = a._swarm.get_connections(ID.from_base58(b.peer_id))  # noqa: SLF001
            assert len(conns) == 1 and b.peer_id in a.connected_peers()
            assert await a.request(b.peer_id, ECHO, b"x",
                                   max_response_bytes=8) == b"x"

    async def bounded() -> None:
        with trio.fail_after(30):  # a hang fails the test, never stalls the suite
            await test()

    trio.run(bounded)
