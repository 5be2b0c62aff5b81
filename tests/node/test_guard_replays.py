"""Replays of a valid request, which only their rate tells apart, against the guard's budget of
streams a peer opens a minute on one protocol (``NetLimits.streams_opened_per_min``): an
honest peer, at ten times the most streams a minute the relay and transport benches saw one
open on any protocol (4), never costs a point; one replaying a request four times a second
is banned within a minute. The clock is the guard's own, stepped by the test."""

from __future__ import annotations

import hashlib
from typing import Any

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from node.p2p.guard import StreamGuard
from node.p2p.host import open_p2p
from node.penalties import FAULT_PENALTIES, PenaltyBook
from node.runtime.limits import NetLimits
from node.runtime.unicast import HANDSHAKE_PROTOCOL_ID
from node.transport import TransportError, read_frame, write_frame
from tests.node.trio_support import Faults, trio_test

#: the libp2p protocols and ours whose streams an honest peer opens one per session or request
PROTOCOLS = ("/ipfs/id/1.0.0", "/meshsub/1.2.0", "/libp2p/autonat/1.0.0",
             "/libp2p/circuit/relay/0.2.0/hop", "/libp2p/circuit/relay/0.2.0/stop",
             "/libp2p/dcutr", "/symphony/net/relay-chunks/1", HANDSHAKE_PROTOCOL_ID)
#: the most streams a minute one honest peer opened on one protocol in the benches, times 10
HONEST_PER_MIN = 40


class _Conn:
    def __init__(self, peer: ID) -> None:
        self.peer_id = peer


class _Stream:
    def __init__(self, peer: ID) -> None:
        self.muxed_conn = _Conn(peer)
        self.was_reset = False

    async def reset(self) -> None:
        self.was_reset = True


class _NullLog:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _peer(name: str) -> ID:
    key = create_new_key_pair(hashlib.sha256(name.encode()).digest())
    return ID.from_pubkey(key.public_key)


async def _open_streams(per_min: int, minutes: int, protocols: tuple[str, ...],
                        peer: ID) -> tuple[list[tuple[int, str]], int]:
    """Streams opened evenly at ``per_min`` on each protocol for ``minutes`` (the guard's
    clock stepped by the test); the faults seen, with their times, and streams served."""
    now = [0]
    book, seen, served = PenaltyBook(), [], [0]
    guard = StreamGuard(NetLimits(), _NullLog(), lambda: now[0])

    def fault(who: str, kind: str, detail: str) -> None:
        seen.append((now[0], kind))
        book.add(who, detail, FAULT_PENALTIES[kind], now[0])

    guard.on_fault = fault

    async def serve(stream: Any) -> None:
        served[0] += 1

    handlers = [guard.wrap(p, serve, ours=True) for p in protocols]
    for step in range(per_min * minutes):
        now[0] = step * 60_000 // per_min
        for handler in handlers:
            await handler(_Stream(peer))
        if book.is_banned(peer.to_base58(), now[0]):
            break
    return seen, served[0]


def test_an_honest_peer_opening_streams_never_costs_a_point() -> None:
    seen, served = trio.run(_open_streams, HONEST_PER_MIN, 10, PROTOCOLS, _peer("honest"))
    assert seen == []
    assert served == HONEST_PER_MIN * 10 * len(PROTOCOLS)


def test_a_request_replayed_four_times_a_second_is_banned_within_a_minute() -> None:
    for protocol in PROTOCOLS:
        seen, _ = trio.run(_open_streams, 240, 2, (protocol,), _peer("replayer"))
        assert {kind for _, kind in seen} == {"flood"}, protocol
        points = len(seen) * FAULT_PENALTIES["flood"]
        assert points >= 100 and seen[-1][0] <= 60_000, (protocol, seen[-1])


@trio_test
async def test_handshake_streams_are_metered_and_unicast_messages_are_not() -> None:
    limits = NetLimits(streams_opened_per_min=3)
    seed = hashlib.sha256(b"guard-replays").digest()
    async with open_p2p(seed, limits=limits) as b, open_p2p(bytes(32)) as a:
        faults = Faults()
        b.set_fault_handler(faults)

        async def answer(peer: str, data: bytes) -> bytes:
            return b"ok"

        b.set_request_handler(HANDSHAKE_PROTOCOL_ID, answer, max_request_bytes=64)
        b.set_request_handler("/symphony/net/msg/1", answer, max_request_bytes=64)
        await a.connect(b.listen_addrs()[0])

        async def on_new_stream(protocol: str) -> bytes:
            """One request on a stream of its own (a.request would reuse its stream)."""
            stream = await a.open_stream(b.peer_id, protocol)
            try:
                await write_frame(stream, b"m")
                return await read_frame(stream, max_bytes=8)
            finally:
                await stream.close()

        for _ in range(5):  # past the budget of 3 on the message protocol: not metered here
            assert await on_new_stream("/symphony/net/msg/1") == b"ok"
        assert faults.seen == []
        for _ in range(4):
            try:
                await on_new_stream(HANDSHAKE_PROTOCOL_ID)
            except TransportError:
                pass  # the fourth is reset
        await faults.wait(1)
        assert faults.kinds == ["flood"] and "streams opened a minute" in faults.seen[0][1]
