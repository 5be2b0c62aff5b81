"""AutoNAT, circuit relay v2 and DCUtR (node/p2p/): codecs, limits and hostile bytes, with
real libp2p hosts on 127.0.0.1, port 0. The NAT itself is tests/node/test_nat.py's.

On loopback every node is publicly reachable, so reservations are asked for directly
(``transport.nat.client.reserve``) where the daemon would wait for AutoNAT to say "private".
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.host.autonat.pb.autonat_pb2 import Message
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, Status, StopMessage
from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch

from node.p2p import dcutr
from node.p2p.autonat import (
    AUTONAT_ID,
    MAX_DIALBACK_ADDRS,
    PRIVATE,
    PUBLIC,
    UNKNOWN,
    Reachability,
    dialback_candidates,
)
from node.p2p.circuit_client import RelayRefused, relay_addrs, split_circuit
from node.p2p.circuit_hop import HOP_ID, STOP_ID
from node.p2p.framing import PeerFault
from node.p2p.host import P2PTransport, open_p2p
from node.p2p.natconfig import NatConfig
from node.p2p.pbwire import MAX_MESSAGE_BYTES, encode_varint, frame, read_message
from node.transport import TransportError
from protocol.names import peer_id_of_multiaddr
from tests.node.trio_support import trio_test

ON = NatConfig(relay_service="on", autonat_interval_s=3600)
PEER_A = "12D3KooWGPYhDGmxSxsBgkAK3vxozzxfoqPyjRSPjQMdPGbQvbew"
PEER_R = "12D3KooWHtZmFBohPtAzihvsQ8kd23JBEW1otDNsFbjtc6GuXgpt"
ECHO = "/symphony/test-net/echo/1"
BULK = "/symphony/test-net/bulk/1"


class _Bytes:
    """A stream that reads from a byte string, in pieces of at most ``step`` bytes."""

    def __init__(self, data: bytes, step: int = 3) -> None:
        self._data, self._step = data, step

    async def read(self, n: int) -> bytes:
        out, self._data = self._data[:min(n, self._step)], self._data[min(n, self._step):]
        return out


def _read(data: bytes, cls: Any = HopMessage) -> Any:
    """read_message over bytes at hand: it never waits, so one step runs it to the end."""
    coro = read_message(_Bytes(data), cls)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("read_message waited on a stream that never makes it wait")


# ---- codecs ---------------------------------------------------------------------------------


def test_a_message_round_trips_and_the_limits_are_faults() -> None:
    message = HopMessage(type=HopMessage.CONNECT)
    message.peer.id = ID.from_base58(PEER_A).to_bytes()
    assert _read(frame(message)) == message
    with pytest.raises(PeerFault) as over:  # refused on the length, before any body
        _read(encode_varint(MAX_MESSAGE_BYTES + 1))
    assert over.value.kind == "oversize"
    with pytest.raises(PeerFault) as long_prefix:
        _read(b"\xff\xff\xff\x01")
    assert long_prefix.value.kind == "oversize"
    with pytest.raises(PeerFault) as cut:
        _read(frame(message)[:-1])
    assert cut.value.kind == "bad_framing"
    with pytest.raises(DecodeError):  # an empty HolePunch: its required type left out
        _read(b"\x00", HolePunch)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_hostile_bytes_decode_or_fail_as_the_peers_fault(data: bytes) -> None:
    for cls in (HopMessage, StopMessage, Message, HolePunch):
        try:
            _read(data, cls)
        except (PeerFault, DecodeError):
            pass


def test_a_relayed_address_names_its_target_last() -> None:
    relayed = f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER_R}/p2p-circuit/p2p/{PEER_A}"
    assert peer_id_of_multiaddr(relayed) == PEER_A
    assert peer_id_of_multiaddr(f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER_R}") == PEER_R
    assert peer_id_of_multiaddr("/ip4/1.2.3.4/tcp/4001") is None
    assert split_circuit(relayed) == (f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER_R}", PEER_R, PEER_A)
    for bad in (f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER_R}",
                f"/ip4/1.2.3.4/tcp/4001/p2p-circuit/p2p/{PEER_A}",
                f"/p2p/{PEER_R}/p2p-circuit/p2p/not-a-peer-id",
                f"/p2p/{PEER_R}/p2p-circuit/p2p/{PEER_A}/extra"):
        with pytest.raises(TransportError):
            split_circuit(bad)


def test_a_relays_addresses_are_kept_only_when_they_are_its_own_and_direct() -> None:
    import multiaddr

    good = multiaddr.Multiaddr("/ip4/1.2.3.4/tcp/4001").to_bytes()
    offered = [good, b"\xff" * 10, b"x" * 300, b"/ip4/0.0.0.0/tcp/9",
               f"/ip4/5.6.7.8/tcp/1/p2p/{PEER_A}".encode(),  # names another peer
               f"/ip4/5.6.7.8/tcp/1/p2p/{PEER_R}/p2p-circuit".encode(),
               b"/ip4/5.6.7.8/udp/1"]
    assert relay_addrs(PEER_R, offered, None) == (f"/ip4/1.2.3.4/tcp/4001/p2p/{PEER_R}",)


def test_dial_backs_go_only_to_the_ip_the_request_came_from() -> None:
    import multiaddr

    offered = [multiaddr.Multiaddr(a).to_bytes() for a in (
        "/ip4/10.0.0.2/tcp/4001", "/ip4/9.9.9.9/tcp/4002", "/ip4/0.0.0.0/tcp/4003",
        "/ip4/1.1.1.1/udp/4004", "/ip4/5.5.5.5/tcp/4005/p2p-circuit")] + [b"junk"]
    assert dialback_candidates(offered, "5.5.5.5") == [
        "/ip4/5.5.5.5/tcp/4001", "/ip4/5.5.5.5/tcp/4002", "/ip4/5.5.5.5/tcp/4003"]
    many = [multiaddr.Multiaddr(f"/ip4/5.5.5.5/tcp/{p}").to_bytes() for p in range(1, 40)]
    assert len(dialback_candidates(many, "5.5.5.5")) == MAX_DIALBACK_ADDRS
    assert dialback_candidates(offered, "not an ip") == []


def test_reachability_is_the_majority_of_the_latest_answers() -> None:
    verdict = Reachability()
    assert verdict.status == UNKNOWN
    verdict.record("a", PRIVATE)
    assert verdict.status == PRIVATE
    verdict.record("b", PUBLIC)
    assert verdict.status == UNKNOWN  # a tie
    verdict.record("a", PUBLIC)  # a peer's latest answer replaces its earlier one
    assert verdict.status == PUBLIC and verdict.answers() == {"b": PUBLIC, "a": PUBLIC}
    for peer in "cdefg":
        verdict.record(peer, PRIVATE)
    assert verdict.status == PRIVATE and len(verdict.answers()) == 5


def test_nat_config_names_the_bad_key() -> None:
    with pytest.raises(ValueError, match="relay_service"):
        NatConfig(relay_service="sometimes")
    with pytest.raises(ValueError, match="max_circuits"):
        NatConfig(max_circuits=0)


# ---- real hosts -----------------------------------------------------------------------------


@asynccontextmanager
async def _hosts(*configs: NatConfig) -> AsyncIterator[list[P2PTransport]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(open_p2p(os.urandom(32), nat=c))
               for c in configs]


def _faults(transport: P2PTransport) -> list[tuple[str, str, str]]:
    seen: list[tuple[str, str, str]] = []
    transport.set_fault_handler(lambda peer, kind, detail: seen.append((peer, kind, detail)))
    return seen


async def _raw(sender: P2PTransport, to: P2PTransport, protocol: str, data: bytes) -> bytes:
    """Send raw bytes on a new stream and read what comes back until it ends."""
    stream = await sender._host.new_stream(ID.from_base58(to.peer_id), [protocol])
    await stream.write(data)
    got = b""
    with trio.move_on_after(5):
        try:
            while chunk := await stream.read(4096):
                got += chunk
        except Exception:
            pass  # reset: the answer so far is all there is
    return got


async def _reserved(relay: P2PTransport, client: P2PTransport) -> str:
    await client.connect(relay.listen_addrs()[0])
    await client.nat.client.reserve(relay.peer_id)  # type: ignore[union-attr]
    return next(a for a in client.listen_addrs() if "/p2p-circuit" in a)


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dcutr, "RELAY_CLOSE_GRACE_S", 0.2)


@trio_test
async def test_a_peer_is_reached_through_a_relay_and_upgraded_to_direct(
        short_grace: None) -> None:
    async with _hosts(ON, ON, ON) as (relay, a, b):
        async def echo(peer: str, data: bytes) -> bytes:
            return b"echo " + data

        a.set_request_handler(ECHO, echo, max_request_bytes=100)
        relayed = await _reserved(relay, a)
        assert peer_id_of_multiaddr(relayed) == a.peer_id
        assert await b.connect(relayed) == a.peer_id
        assert await b.request(a.peer_id, ECHO, b"hi", max_response_bytes=100) == b"echo hi"
        assert relay.nat.relay.counts["circuit"] == 1  # type: ignore[union-attr]
        # A received the relayed connection and upgrades it: B is public, A dials it
        puncher = a.nat.puncher  # type: ignore[union-attr]
        while puncher.counts["unilateral"] < 1:
            await trio.sleep(0.05)
        assert puncher.has_direct(b.peer_id)
        assert await b.request(a.peer_id, ECHO, b"again", max_response_bytes=100) == \
            b"echo again"
        while b.nat.relayed_only(a.peer_id) or len(  # type: ignore[union-attr]
                b._swarm.get_connections(ID.from_base58(a.peer_id))) > 1:
            await trio.sleep(0.1)  # the relayed connection closes after its grace


@trio_test
async def test_relay_limits_are_refused_with_the_specs_status() -> None:
    one = NatConfig(relay_service="on", max_reservations=1, autonat_interval_s=3600)
    async with _hosts(one, ON, ON, NatConfig(relay_service="off", autonat=False)) as (
            relay, a, b, plain):
        await _reserved(relay, a)
        await b.connect(relay.listen_addrs()[0])
        with pytest.raises(RelayRefused) as full:
            await b.nat.client.reserve(relay.peer_id)  # type: ignore[union-attr]
        assert full.value.status == Status.RESOURCE_LIMIT_EXCEEDED
        # no reservation, no circuit
        with pytest.raises(RelayRefused) as none:
            await a.connect(f"{relay.listen_addrs()[0]}/p2p-circuit/p2p/{b.peer_id}")
        assert none.value.status == Status.NO_RESERVATION
        # a node that does not relay refuses to (py-libp2p: the protocol is not even served)
        await b.connect(plain.listen_addrs()[0])
        with pytest.raises(TransportError):
            await b.nat.client.reserve(plain.peer_id)  # type: ignore[union-attr]


@trio_test
async def test_auto_mode_relays_only_once_autonat_says_public() -> None:
    auto = NatConfig(autonat=False)  # nobody asks: the verdict stays unknown
    async with _hosts(auto, ON) as (relay, a):
        await a.connect(relay.listen_addrs()[0])
        with pytest.raises(RelayRefused) as refused:
            await a.nat.client.reserve(relay.peer_id)  # type: ignore[union-attr]
        assert refused.value.status == Status.RESERVATION_REFUSED
        relay.nat.reachability.record(a.peer_id, PUBLIC)  # type: ignore[union-attr]
        await a.nat.client.reserve(relay.peer_id)  # type: ignore[union-attr]


@trio_test
async def test_a_circuit_ends_at_its_byte_limit() -> None:
    small = NatConfig(relay_service="on", autonat=False, hole_punch=False,
                      circuit_max_bytes=256 << 10, circuit_rate_bytes_per_s=64 << 20)
    quiet = NatConfig(autonat=False, hole_punch=False)
    async with _hosts(small, quiet, quiet) as (relay, a, b):
        received = trio.Event()

        async def sink(peer: str, stream: Any) -> None:
            while await stream.read(65536):
                pass
            received.set()

        a.set_stream_handler(BULK, sink)
        await b.connect(await _reserved(relay, a))
        stream = await b.open_stream(a.peer_id, BULK)
        with pytest.raises(TransportError):
            for _ in range(64):  # 4 MiB through a circuit allowed 256 KiB
                await stream.write(b"x" * 65536)
        while relay.nat.relay.counts["circuit_over_bytes"] < 1:  # type: ignore[union-attr]
            await trio.sleep(0.05)


@trio_test
async def test_autonat_dials_back_and_says_public_on_loopback() -> None:
    async with _hosts(NatConfig(autonat=False), ON) as (server, client):
        await client.connect(server.listen_addrs()[0])
        while client.nat.reachability.status != PUBLIC:  # type: ignore[union-attr]
            await trio.sleep(0.05)
        assert server.nat.server.answered == {"OK": 1}  # type: ignore[union-attr]


@trio_test
async def test_hostile_bytes_on_the_nat_protocols_are_penalized() -> None:
    tight = NatConfig(relay_service="on", autonat=False, dialback_requests_per_peer_per_min=1,
                      hop_requests_per_peer_per_min=2)
    async with _hosts(tight, NatConfig(autonat=False)) as (victim, attacker):
        seen = _faults(victim)
        await attacker.connect(victim.listen_addrs()[0])
        await _raw(attacker, victim, HOP_ID, encode_varint(1 << 20))
        await _raw(attacker, victim, HOP_ID, b"\x05\xff\xff\xff\xff\xff")
        await _raw(attacker, victim, HOP_ID, frame(HopMessage(type=HopMessage.STATUS)))
        # a /stop stream from a peer we hold no reservation with
        answer = await _raw(attacker, victim, STOP_ID, frame(StopMessage(
            type=StopMessage.CONNECT)))
        refusal = StopMessage()
        refusal.ParseFromString(answer[1:])
        assert refusal.status == Status.PERMISSION_DENIED
        dial = Message(type=Message.DIAL)
        dial.dial.peer.id = ID.from_base58(PEER_A).to_bytes()  # not the asker
        await _raw(attacker, victim, AUTONAT_ID, frame(dial))
        await _raw(attacker, victim, AUTONAT_ID, frame(Message(type=Message.DIAL)))  # flood
        # valid reservations, replayed: the third hop request in a minute is over the budget
        reserve = frame(HopMessage(type=HopMessage.RESERVE))
        granted = HopMessage()
        granted.ParseFromString((await _raw(attacker, victim, HOP_ID, reserve))[1:])
        assert granted.status == Status.OK
        answer = await _raw(attacker, victim, HOP_ID, reserve)
        refused = HopMessage()
        refused.ParseFromString(answer[1:])
        assert refused.status == Status.RESOURCE_LIMIT_EXCEEDED
        kinds = [kind for peer, kind, _ in seen if peer == attacker.peer_id]
        assert kinds == ["oversize", "undecodable", "invalid", "invalid", "invalid", "flood",
                         "flood"]


@trio_test
async def test_the_transport_bench_sends_through_the_relay_then_directly() -> None:
    from node.bench.transport.circuit import throughputs

    figures = await throughputs(1 << 20)
    assert figures["relayed_mbps"] > 0 and figures["direct_mbps"] > 0
    assert figures["relayed_vs_direct_ratio"] == pytest.approx(
        figures["relayed_mbps"] / figures["direct_mbps"])


@trio_test
async def test_a_bulk_stream_waits_for_a_hole_punch_in_progress() -> None:
    import trio.testing

    quiet = NatConfig(autonat=False, hole_punch=False)
    async with _hosts(quiet, quiet) as (a, b):
        async def sink(peer: str, stream: Any) -> None:
            while await stream.read(65536):
                pass

        a.set_stream_handler(BULK, sink)
        await b.connect(a.listen_addrs()[0])
        punch = b.nat.puncher.in_progress[a.peer_id] = trio.Event()  # type: ignore[union-attr]
        opened: list[Any] = []

        async def open_bulk() -> None:
            opened.append(await b.open_stream(a.peer_id, BULK))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_bulk)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert not opened  # held back while the punch may still give a direct path
            punch.set()
        assert len(opened) == 1
        await opened[0].close()


@trio_test
async def test_a_relay_listening_on_every_interface_is_reached_by_its_real_addresses() -> None:
    every = NatConfig(relay_service="on", autonat=False)
    client = NatConfig(autonat=False, reserve_always=True, hole_punch=False)
    async with AsyncExitStack() as stack:
        relay = await stack.enter_async_context(open_p2p(
            os.urandom(32), listen=["/ip4/0.0.0.0/tcp/0"], nat=every))
        a = await stack.enter_async_context(open_p2p(os.urandom(32), nat=client))
        b = await stack.enter_async_context(open_p2p(os.urandom(32), nat=NatConfig(
            autonat=False)))
        port = relay.listen_addrs()[0].split("/")[4]
        dialled = f"/ip4/127.0.0.1/tcp/{port}/p2p/{relay.peer_id}"
        await a.connect(dialled)
        while not a.nat.client.relayed_addrs():  # type: ignore[union-attr]
            await trio.sleep(0.05)  # the NAT loop reserves on its next tick
        relayed = a.nat.client.relayed_addrs()  # type: ignore[union-attr]
        assert not any("/0.0.0.0/" in r for r in relayed)
        assert f"{dialled}/p2p-circuit/p2p/{a.peer_id}" in relayed  # the address we dialled
        assert await b.connect(relayed[0]) == a.peer_id  # the relay's own, expanded
