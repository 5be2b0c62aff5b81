"""The first connection to a node behind a NAT, dialed the way the daemon dials (dial_plan, then
dial_first over the transport's connect): its private address first, its relayed one next.

Layout: tests/node/test_nat.py's NAT. Relay C and dialer B run in this process in the root
namespace; target A (tests/node/nat_peer.py) runs in the private namespace, reserves a slot on
C and announces its relayed address. From B, A's private address is a black hole: B has a route
to it, through the router, whose forward chain drops every new connection from outside, so a
dial to it sends SYNs nobody answers and would hang until the transport's dial timeout.

The issue's criterion is a connection in under 3 s, where dialing the private address alone
first took over the 10 s dial timeout. What the test holds, without timing it: the relayed
address wins while the private dial is still pending (its dial is cancelled, not failed, and
its socket is gone), so the connection never waited on the dial timeout.

Needs root, ``ip netns`` and ``nft``; skips with the reason where they are not allowed.
"""

from __future__ import annotations

import os

import psutil
import pytest
import trio

from node.p2p.host import P2PTransport, open_p2p
from node.p2p.natconfig import NatConfig
from node.p2p.swarm import DIAL_TIMEOUT_S
from node.runtime.dialing import dial_first, dial_plan
from tests.node.nat_peer import ECHO
from tests.node.netns import Nat, NatPeer

pytestmark = pytest.mark.integration

def _sockets_to(ip: str) -> list[str]:
    """This process's TCP sockets to ``ip`` (a cancelled dial must leave none behind)."""
    return [c.status for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.ip == ip]


def test_the_first_connection_to_a_natd_node_goes_through_its_relayed_address(
        nat: Nat) -> None:
    async def test() -> None:
        public = [f"/ip4/{nat.public_ip}/tcp/0"]
        async with open_p2p(os.urandom(32), listen=public,
                            nat=NatConfig(relay_service="on", autonat=False)) as c, \
                open_p2p(os.urandom(32), listen=public,
                         nat=NatConfig(relay_service="off", autonat=False)) as b:
            a = NatPeer(nat.private, "target", f"/ip4/{nat.private_ip}/tcp/0",
                        c.listen_addrs()[0])
            try:
                # its lines are read in a thread: C and B run on this trio loop meanwhile
                first = await trio.to_thread.run_sync(a.next)
                private, peer = first["addrs"][0], first["peer"]
                await trio.to_thread.run_sync(a.next)  # its candidates (C told it)
                relayed = (await trio.to_thread.run_sync(a.next))["relayed"][0]
                await _dial(b, peer, private, relayed, nat.private_ip)
            finally:
                a.stop()

    async def bounded() -> None:
        with trio.fail_after(4 * DIAL_TIMEOUT_S):  # a hang fails the test, never stalls it
            await test()

    trio.run(bounded)


async def _dial(b: P2PTransport, peer: str, private: str, relayed: str,
                private_ip: str) -> None:
    plan, errors = dial_plan(peer, [relayed, private])
    assert plan == [private, relayed] and errors == []  # direct first, as the daemon dials
    events: list[tuple[str, str]] = []

    async def connect(addr: str) -> str:
        events.append(("start", addr))
        try:
            return await b.connect(addr)
        except BaseException as exc:
            # trio.open_tcp_stream's own nursery hands its cancellation on in a group
            only_cancelled = isinstance(exc, BaseExceptionGroup) and not exc.split(
                trio.Cancelled)[1]
            if isinstance(exc, trio.Cancelled) or only_cancelled:
                events.append(("cancelled", addr))
            raise

    outcome = await dial_first(connect, plan)
    # the relayed address won while the private dial still hung (cancelled, never failed):
    # the connection did not wait on the private address's dial timeout
    assert outcome.addr == relayed and outcome.errors == (), outcome
    assert sorted(events) == sorted([("start", private), ("start", relayed),
                                     ("cancelled", private)]), events
    assert peer in b.connected_peers()
    assert await b.request(peer, ECHO, b"ping", max_response_bytes=64) == b"ping"
    assert _sockets_to(private_ip) == []  # the cancelled dial's socket was closed
