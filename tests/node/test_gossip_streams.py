"""Gossip streams under the guard: py-libp2p's honest stream churn costs no points, a flood of
streams still does. Real libp2p hosts on 127.0.0.1, port 0; waits on events and messages,
bounded by trio deadlines."""

from __future__ import annotations

import hashlib

import trio
from libp2p.peer.id import ID

from node.p2p.host import open_p2p
from node.runtime.limits import NetLimits
from tests.node.trio_support import Faults, trio_test

TOPIC = "test-gossip-streams"
LATER = "test-gossip-streams-later"


def seed(n: int) -> bytes:
    return hashlib.sha256(f"test-gossip-streams-{n}".encode()).digest()


@trio_test
async def test_gossip_streams_py_libp2p_abandons_and_reopens_cost_no_points() -> None:
    """py-libp2p drops its outbound gossip stream to a peer when a write on it fails (a yamux
    window that stayed shut 5 s while the reader was busy raises; ``Pubsub.write_msg`` then
    calls ``_handle_dead_peer``) and opens a new one while connected, without closing the old:
    the reader saw one more open stream each time, and refused the third as a flood."""
    async with open_p2p(seed(1)) as a, open_p2p(seed(2)) as b:
        faults = Faults()
        b.set_fault_handler(faults)
        await b.subscribe(TOPIC)
        await a.subscribe(TOPIC)
        await a.connect(b.listen_addrs()[0])
        with trio.fail_after(20):
            await a.wait_topic_peer(TOPIC, b.peer_id)
        pubsub, peer = a._gossip.pubsub, ID.from_base58(b.peer_id)  # noqa: SLF001
        for _ in range(4):
            dropped = pubsub.peers[peer]
            pubsub._handle_dead_peer(peer)  # noqa: SLF001  (what a failed write does)
            await pubsub.wait_for_peer(peer, timeout=20)  # re-registered on a new stream
            assert pubsub.peers[peer] is not dropped
        # py-libp2p forgot b's subscriptions with the stream: a new topic, announced both ways
        # (a's announcement on a's newest stream), meshed, and a message from a on it
        inbox = await b.subscribe(LATER)
        await a.subscribe(LATER)
        with trio.fail_after(20):
            await b.wait_topic_peer(LATER, a.peer_id)
            await a.wait_topic_peer(LATER, b.peer_id)
            await a.publish(LATER, b"after the churn")
            sender, data = await inbox.receive()
        assert (sender, data) == (a.peer_id, b"after the churn")
        assert faults.seen == [] and b.stream_faults == {}


@trio_test
async def test_a_peer_flooding_gossip_streams_holds_few_and_is_refused_past_its_budget() -> None:
    limits = NetLimits(max_gossip_streams_per_peer=2, streams_opened_per_min=4)
    async with open_p2p(seed(3)) as a, open_p2p(seed(4), limits=limits) as b:
        faults = Faults()
        b.set_fault_handler(faults)
        await a.connect(b.listen_addrs()[0])
        quiet = "/meshsub/1.0.0"  # not the one a's own pubsub agreed on with b
        held = [await a.open_stream(b.peer_id, quiet) for _ in range(2)]
        for n in range(2):  # each stream past the cap replaces the oldest: no more held open
            held.append(await a.open_stream(b.peer_id, quiet))
            await _ended(held[n])
        try:  # past the streams a peer may open a minute: refused at once, a flood
            await _ended(await a.open_stream(b.peer_id, quiet))
        except Exception:
            pass  # the reset may even beat the protocol's acknowledgement
        await faults.wait(1)
        assert faults.kinds == ["flood"] and "streams opened a minute" in faults.seen[0][1]
        for stream in held[2:]:
            await stream.reset()


async def _ended(stream: object) -> None:
    """Read until the other side ends or resets the stream."""
    with trio.fail_after(10):
        try:
            while await stream.read(1024):  # type: ignore[attr-defined]
                pass
        except Exception:
            pass
