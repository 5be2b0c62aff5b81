"""The guard's budgets and frame checks that make every fuzz-bench attack kind cost points:
real libp2p hosts on 127.0.0.1, port 0; waits on events, bounded by trio deadlines."""

from __future__ import annotations

import hashlib

import pytest
import trio
from libp2p.identity.identify.pb.identify_pb2 import Identify
from libp2p.pubsub.pb import rpc_pb2

from node.p2p.frame_checks import PING_STREAMS_PER_PEER, check_gossip_rpc, check_identify
from node.p2p.framing import PeerFault
from node.p2p.host import open_p2p
from node.runtime.limits import NetLimits
from node.transport import TransportError
from tests.node.trio_support import Faults, trio_test

BULK = "/symphony/test-net/bulk/1"


def seed(n: int) -> bytes:
    return hashlib.sha256(f"test-guard-{n}".encode()).digest()


@pytest.mark.parametrize(("body", "kind"), [
    (b"\x28\x05\x30\x07", "undecodable"),  # fields 5 and 6: valid protobuf, nothing gossipsub
    (rpc_pb2.RPC(publish=[rpc_pb2.Message(data=b"x", topicIDs=["t"])]).SerializeToString(),
     "invalid"),  # unsigned
])
def test_gossip_frames_no_honest_peer_sends_are_faults(body: bytes, kind: str) -> None:
    with pytest.raises(PeerFault) as caught:
        check_gossip_rpc(body)
    assert caught.value.kind == kind


def test_honest_gossip_and_identify_frames_pass() -> None:
    subscribe = rpc_pb2.RPC(subscriptions=[rpc_pb2.RPC.SubOpts(subscribe=True, topicid="t")])
    signed = rpc_pb2.RPC(publish=[rpc_pb2.Message(data=b"x", topicIDs=["t"],
                                                  signature=b"s" * 64, key=b"k" * 36)])
    for body in (b"", subscribe.SerializeToString(), signed.SerializeToString()):
        check_gossip_rpc(body)
    check_identify(Identify(agent_version="x", protocols=["/a"]).SerializeToString())
    with pytest.raises(PeerFault):
        check_identify(b"\x78\x01")  # field 15, a varint: nothing identify defines


@trio_test
async def test_streams_opened_past_the_budget_are_floods() -> None:
    limits = NetLimits(streams_opened_per_min=3)
    async with open_p2p(seed(1), limits=limits) as b, open_p2p(seed(2)) as a:
        faults = Faults()
        b.set_fault_handler(faults)
        served = trio.Semaphore(0)

        async def serve(peer: str, stream: object) -> None:
            served.release()

        b.set_stream_handler(BULK, serve)  # type: ignore[arg-type]
        await a.connect(b.listen_addrs()[0])
        for _ in range(4):
            try:
                stream = await a.open_stream(b.peer_id, BULK)
                await stream.write(b"x")
                await stream.close()
            except TransportError:
                pass  # the fourth is reset, maybe before its negotiation is done
        await faults.wait(1)
        assert faults.kinds == ["flood"] and "streams opened a minute" in faults.seen[0][1]
        with trio.fail_after(10):
            for _ in range(3):
                await served.acquire()  # the first three were served


@trio_test
async def test_a_ping_stream_past_py_libp2ps_own_cap_is_a_flood() -> None:
    async with open_p2p(seed(3)) as b, open_p2p(seed(4)) as a:
        faults = Faults()
        b.set_fault_handler(faults)
        await a.connect(b.listen_addrs()[0])
        streams = []
        for _ in range(PING_STREAMS_PER_PEER + 1):
            try:
                stream = await a.open_stream(b.peer_id, "/ipfs/ping/1.0.0")
                streams.append(stream)
                await stream.write(b"p" * 32)
            except TransportError:
                pass  # the one past the cap is reset, maybe before its negotiation is done
        await faults.wait(1)
        assert faults.kinds == ["flood"]
        for stream in streams:
            await stream.reset()


@trio_test
async def test_a_closing_connection_gets_no_new_stream_served() -> None:
    async with open_p2p(seed(5)) as b, open_p2p(seed(6)) as a:
        opened = trio.Event()

        async def serve(peer: str, stream: object) -> None:
            opened.set()

        b.set_stream_handler(BULK, serve)  # type: ignore[arg-type]
        await a.connect(b.listen_addrs()[0])
        conns = b._swarm.connections[next(iter(b._swarm.connections))]  # noqa: SLF001
        b._guard.closing(a.peer_id, [c.muxed_conn for c in conns])  # noqa: SLF001
        with pytest.raises(TransportError):  # reset before its protocol is even negotiated
            await a.open_stream(b.peer_id, BULK)
        assert not opened.is_set()
