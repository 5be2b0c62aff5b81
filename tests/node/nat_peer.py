"""One libp2p transport with NAT traversal, run in a network namespace by tests/node/test_nat.py.

    python -m tests.node.nat_peer ROLE LISTEN [DIAL...]

ROLE ``relay`` relays for anyone. ROLE ``target`` connects to the relay (its first DIAL),
reserves a slot and serves an echo protocol. ROLE ``dialer`` connects to the relay, then to
the target's relayed address (its second DIAL) and sends an echo. Each prints one JSON line
per thing it learns (``addrs``, ``relayed``, ``echo``, ``direct``) and runs until stdin closes.
"""

from __future__ import annotations

import json
import os
import sys

import structlog
import trio

from node.p2p.host import P2PTransport, open_p2p
from node.p2p.natconfig import NatConfig

ECHO = "/symphony/nat-test/echo/1"
DIRECT_WAIT_S = 60.0


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def _until_stdin_closes() -> None:
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    while await stdin.receive_some(1024):
        pass


async def _observed(transport: P2PTransport) -> None:
    """Until a peer (the relay, through identify) has told us the address it sees us at."""
    assert transport.nat is not None
    own = {a.split("/")[2] for a in transport.nat.direct_addrs()}
    with trio.move_on_after(DIRECT_WAIT_S):
        while all(a.split("/")[2] in own for a in transport.nat.candidates()):
            await trio.sleep(0.1)  # identify runs in py-libp2p's background: no event
    say(candidates=transport.nat.candidates())


async def _direct(transport: P2PTransport, peer: str) -> None:
    assert transport.nat is not None  # built with a NatConfig
    with trio.move_on_after(DIRECT_WAIT_S):
        while not transport.nat.puncher.has_direct(peer):
            await trio.sleep(0.1)  # polling py-libp2p's connection table: no event to wait on
    say(direct=transport.nat.puncher.has_direct(peer),
        punch=dict(transport.nat.puncher.counts))


async def main(role: str, listen: str, dial: list[str]) -> None:
    config = NatConfig(relay_service="on" if role == "relay" else "off", autonat=False)
    async with open_p2p(os.urandom(32), listen=[listen], nat=config) as transport:
        say(addrs=transport.listen_addrs(), peer=transport.peer_id)
        if role == "target":
            async def echo(peer: str, data: bytes) -> bytes:
                return data

            transport.set_request_handler(ECHO, echo, max_request_bytes=64)
            relay = await transport.connect(dial[0])
            assert transport.nat is not None
            await transport.nat.client.reserve(relay)
            await _observed(transport)
            say(relayed=transport.nat.client.relayed_addrs())
        elif role == "dialer":
            await transport.connect(dial[0])
            await _observed(transport)
            target = await transport.connect(dial[1])
            reply = await transport.request(target, ECHO, b"ping", max_response_bytes=64)
            say(echo=reply.decode())
            await _direct(transport, target)
        await _until_stdin_closes()


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: ours
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3:])
