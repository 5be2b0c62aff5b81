"""The driver's routing and effects, over an in-memory transport (a test double of Transport).

Every test runs in trio's MockClock with autojump, so timers and timeouts take no real time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import trio
import trio.testing

from node.driver import INVALID_MESSAGE_PENALTY, UNROUTED_MESSAGE_PENALTY, Driver
from node.penalties import (
    BAN_MS,
    FAULT_PENALTIES,
    MAX_PENALIZED_PEERS,
    PENALTY_BAN_THRESHOLD,
    PenaltyBook,
)
from node.runtime.limits import NetLimits
from node.runtime.unicast import HANDSHAKE_PROTOCOL_ID, OUTBOX_SIZE, SEND_TIMEOUT_S
from node.service import Service
from node.transport import PeerEvent, TransportError
from protocol.codec import decode, encode
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.machine import (
    Dial,
    DialFailed,
    Disconnect,
    Emit,
    PeerConnected,
    PeerDisconnected,
    Penalize,
    Publish,
    Received,
    Send,
    SendFailed,
    Tick,
)
from protocol.membership.messages import Hello, PeerList, PeerListRequest, Ping, Pong
from protocol.names import protocol_id, topic

NET = "testnet"
MSG = protocol_id(NET, "msg")


class FakeNet:
    def __init__(self) -> None:
        self.nodes: dict[str, FakeTransport] = {}


class FakeTransport:
    """In-memory Transport: connect/request/publish go straight to the other FakeTransport."""

    def __init__(self, net: FakeNet, peer_id: str) -> None:
        self.net = net
        self.peer_id = peer_id
        net.nodes[peer_id] = self
        self.handlers: dict[str, Any] = {}
        self.peers: set[str] = set()
        self.subs: dict[str, trio.MemorySendChannel[tuple[str, bytes]]] = {}
        self.events_send, self.events = trio.open_memory_channel[PeerEvent](100)
        self.requests: list[tuple[str, str]] = []
        self.stall = False  # requests to this node never answer
        self.stalled_types: set[type] = set()  # requests carrying these never answer

    def listen_addrs(self) -> list[str]:
        return [f"/memory/{self.peer_id}/p2p/{self.peer_id}"]

    async def listen_addrs_changed(self, seen: Sequence[str]) -> list[str]:
        if list(seen) == self.listen_addrs():
            await trio.sleep_forever()  # a fake node's one address never changes
        return self.listen_addrs()

    async def connect(self, addr: str) -> str:
        peer = addr.rsplit("/p2p/", 1)[1]
        other = self.net.nodes.get(peer)
        if other is None or peer == self.peer_id:
            raise TransportError(f"dial {addr} refused")
        if peer not in self.peers:
            self.peers.add(peer)
            other.peers.add(self.peer_id)
            await self.events_send.send(PeerEvent(peer, True))
            await other.events_send.send(PeerEvent(self.peer_id, True))
        return peer

    async def disconnect(self, peer: str) -> None:
        if peer in self.peers:
            self.peers.discard(peer)
            other = self.net.nodes[peer]
            other.peers.discard(self.peer_id)
            await self.events_send.send(PeerEvent(peer, False))
            await other.events_send.send(PeerEvent(self.peer_id, False))

    def connected_peers(self) -> list[str]:
        return sorted(self.peers)

    def peer_events(self) -> trio.MemoryReceiveChannel[PeerEvent]:
        return self.events

    def set_request_handler(self, pid: str, handler: Any, *, max_request_bytes: int) -> None:
        self.handlers[pid] = handler

    def set_fault_handler(self, handler: Any) -> None:
        self.on_fault = handler

    async def request(self, peer: str, pid: str, data: bytes, *, max_response_bytes: int) -> bytes:
        if peer not in self.peers:
            raise TransportError(f"no connection to {peer}")
        other = self.net.nodes[peer]
        self.requests.append((peer, pid))
        if other.stall or (other.stalled_types and type(decode(data)) in other.stalled_types):
            await trio.sleep_forever()
        if pid not in other.handlers:
            raise TransportError(f"{peer} does not speak {pid}")
        return bytes(await other.handlers[pid](self.peer_id, data))

    async def subscribe(self, name: str) -> trio.MemoryReceiveChannel[tuple[str, bytes]]:
        send, receive = trio.open_memory_channel[tuple[str, bytes]](100)
        self.subs[name] = send
        return receive

    async def publish(self, name: str, data: bytes) -> None:
        for peer in sorted(self.peers):
            sub = self.net.nodes[peer].subs.get(name)
            if sub is not None:
                await sub.send((self.peer_id, data))


class RecordingLog:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        def record(event: str, **fields: Any) -> None:
            self.lines.append((level, event, fields))

        return record

    def events(self, name: str) -> list[dict[str, Any]]:
        return [fields for _, event, fields in self.lines if event == name]


@dataclass
class ScriptedMachine:
    """Records events; answers Ping with Pong; returns whatever effects a test queues."""

    seen: list[object] = field(default_factory=list)
    queued: list[object] = field(default_factory=list)
    deadline: int | None = None
    raise_on: type | None = None
    changed: trio.Event = field(default_factory=trio.Event)

    def handle(self, event: object, now: int) -> list[object]:
        self.seen.append(event)
        self.changed.set()
        self.changed = trio.Event()
        if self.raise_on is not None and isinstance(event, self.raise_on):
            raise RemoteProtocolError("peer-x", "bad thing", penalty=7)
        if isinstance(event, Tick):
            self.deadline = None
            return [Emit("ticked", {"at": now})]
        if isinstance(event, Received) and isinstance(event.message, Ping):
            return [Send(event.peer, Pong(nonce=event.message.nonce))]
        out, self.queued = self.queued, []
        return out

    def next_deadline(self) -> int | None:
        return self.deadline

    async def wait_for(self, predicate: Any) -> object:
        with trio.fail_after(30):
            while True:
                for event in self.seen:
                    if predicate(event):
                        return event
                await self.changed.wait()


class PingService(Service):
    name: ClassVar[str] = "pinger"
    message_types = (Ping, Pong, Hello)
    topics = ("chatter",)

    def __init__(self) -> None:
        self._machine = ScriptedMachine()
        self.performed: list[object] = []

    @property
    def machine(self) -> ScriptedMachine:
        return self._machine

    async def perform(self, effect: object) -> None:
        self.performed.append(effect)


@dataclass(frozen=True)
class StoreThing:
    key: str


async def start_node(nursery: trio.Nursery, net: FakeNet, peer: str,
                     limits: NetLimits | None = None) -> tuple[Driver, Any, Any]:
    transport = FakeTransport(net, peer)
    log = RecordingLog()
    driver = Driver(transport, network_id=NET, log=log, limits=limits)
    service = PingService()
    driver.add_service(service)
    await nursery.start(driver.run)
    return driver, service, log


def run(test: Any) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))


def is_received(kind: type) -> Any:
    return lambda e: isinstance(e, Received) and isinstance(e.message, kind)


def test_send_is_routed_by_type_and_answered() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, sb, _ = await start_node(nursery, net, "B")
            await a.transport.connect("/memory/B/p2p/B")
            connected = await sa.machine.wait_for(lambda e: isinstance(e, PeerConnected))
            assert connected == PeerConnected("B", (), False)  # connect() outside a Dial
            await a.submit("pinger", None)
            sa.machine.queued = [Send("B", Ping(nonce=42))]
            await a.submit("pinger", None)
            pong = await sa.machine.wait_for(is_received(Pong))
            assert pong == Received("B", Pong(nonce=42))
            assert Received("A", Ping(nonce=42)) in sb.machine.seen
            assert a.transport.requests[0] == ("B", MSG)
            nursery.cancel_scope.cancel()

    run(main)


def test_hello_travels_on_the_network_independent_handshake_protocol() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, sb, _ = await start_node(nursery, net, "B")
            await a.transport.connect("/memory/B/p2p/B")
            hello = Hello(network_id="othernet", protocol_version=1, agent_version="x",
                          listen_addrs=())
            sa.machine.queued = [Send("B", hello)]
            await a.submit("pinger", None)
            await sb.machine.wait_for(is_received(Hello))
            assert ("B", HANDSHAKE_PROTOCOL_ID) in a.transport.requests
            # only handshake types are accepted on the handshake protocol
            reply = await a.transport.request("B", HANDSHAKE_PROTOCOL_ID, encode(Ping(nonce=1)),
                                              max_response_bytes=256)
            assert reply == b"unexpected message type"
            nursery.cancel_scope.cancel()

    run(main)


def test_garbage_is_penalized_logged_with_peer_and_the_node_keeps_serving() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, sb, blog = await start_node(nursery, net, "B")
            await a.transport.connect("/memory/B/p2p/B")
            for frame in (b"\xff\x00garbage", b"", encode(Ping(nonce=1))[:-1]):
                reply = await a.transport.request("B", MSG, frame, max_response_bytes=256)
                assert reply == b"invalid message"
            # logged once for the peer and kind; every one is counted
            penalties = blog.events("driver.penalized")
            assert [p["peer"] for p in penalties] == ["A"]
            assert b.status()["penalties"]["A"]["score"] == 3 * INVALID_MESSAGE_PENALTY
            # a well-formed message from the same peer is still served
            assert await a.transport.request("B", MSG, encode(Ping(nonce=5)),
                                             max_response_bytes=256) == b""
            await sb.machine.wait_for(is_received(Ping))
            nursery.cancel_scope.cancel()

    run(main)


def test_replays_and_floods_are_refused_and_penalized() -> None:
    async def main() -> None:
        net = FakeNet()
        limits = NetLimits(replay_allowance=2, replay_min_bytes=1, max_messages_per_peer_per_s=8)
        async with trio.open_nursery() as nursery:
            a, _, _ = await start_node(nursery, net, "A")
            b, sb, blog = await start_node(nursery, net, "B", limits)
            await a.transport.connect("/memory/B/p2p/B")
            frame = encode(Ping(nonce=7))
            replies = [await a.transport.request("B", MSG, frame, max_response_bytes=256)
                       for _ in range(5)]
            assert replies == [b"", b"", b"replay", b"replay", b"replay"]
            assert len([e for e in sb.machine.seen if is_received(Ping)(e)]) == 2
            # a repeatable message (a hello on reconnect) sent verbatim again is no replay
            poll = encode(Hello(network_id="n", protocol_version=1, agent_version="t",
                                listen_addrs=()))
            replies = [await a.transport.request("B", MSG, poll, max_response_bytes=256)
                       for _ in range(3)]
            assert replies == [b"", b"", b""]
            replies = [await a.transport.request("B", MSG, encode(Ping(nonce=n)),
                                                 max_response_bytes=256) for n in range(1)]
            assert replies == [b"flood"]  # 8 per second, none refilled yet
            status = b.status()
            assert status["faults"] == {"replay": 3, "flood": 1}
            assert status["penalties"]["A"]["total"] == (3 * FAULT_PENALTIES["replay"]
                                                         + FAULT_PENALTIES["flood"])
            assert [e["reason"].split(":")[0] for e in blog.events("driver.penalized")] == [
                "replay", "flood"]
            nursery.cancel_scope.cancel()

    run(main)


def test_a_message_no_service_owns_is_refused_and_penalized() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, _, _ = await start_node(nursery, net, "A")
            b, _, blog = await start_node(nursery, net, "B")
            await a.transport.connect("/memory/B/p2p/B")
            reply = await a.transport.request("B", MSG, encode(PeerListRequest(max_peers=3)),
                                              max_response_bytes=256)
            assert reply == b"unexpected message type"
            assert blog.events("driver.penalized")[0]["peer"] == "A"
            nursery.cancel_scope.cancel()

    run(main)


def test_penalties_over_the_threshold_disconnect_and_ban() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, sb, blog = await start_node(nursery, net, "B")
            await a.transport.connect("/memory/B/p2p/B")
            await sb.machine.wait_for(lambda e: isinstance(e, PeerConnected))
            sb.machine.queued = [Penalize("A", "spam", PENALTY_BAN_THRESHOLD - 1)]
            await b.submit("pinger", None)
            assert not b.is_banned("A")
            sb.machine.queued = [Penalize("A", "more spam", 1)]
            await b.submit("pinger", None)
            assert b.is_banned("A") and blog.events("driver.banned")[0]["peer"] == "A"
            await sb.machine.wait_for(lambda e: e == PeerDisconnected("A"))
            # a banned peer reconnecting is dropped again, and dials to it are refused
            await a.transport.connect("/memory/B/p2p/B")
            await sa.machine.wait_for(lambda e: e == PeerDisconnected("B"))
            sb.machine.queued = [Dial("A", ("/memory/A",))]
            await b.submit("pinger", None)
            await sb.machine.wait_for(lambda e: e == DialFailed("A", "banned"))
            await trio.sleep(BAN_MS / 1000)  # MockClock: the ban expires in virtual time
            assert not b.is_banned("A")
            nursery.cancel_scope.cancel()

    run(main)


def test_remote_protocol_error_from_a_machine_penalizes_and_keeps_running() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, log = await start_node(nursery, net, "A")
            sa.machine.raise_on = str
            await a.submit("pinger", "boom")
            assert log.events("driver.penalized")[0] == {
                "peer": "peer-x", "reason": "bad thing", "points": 7, "score": 7}
            sa.machine.raise_on = None
            sa.machine.queued = [Emit("still_alive", {"level": "warning", "n": 1})]
            await a.submit("pinger", None)
            assert ("warning", "pinger.still_alive", {"n": 1}) in log.lines
            nursery.cancel_scope.cancel()

    run(main)


def test_send_failures_come_back_as_send_failed() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, _, _ = await start_node(nursery, net, "B")
            sa.machine.queued = [Send("B", Ping(nonce=1))]  # not connected
            await a.submit("pinger", None)
            failed = await sa.machine.wait_for(lambda e: isinstance(e, SendFailed))
            assert failed.peer == "B" and "no connection" in failed.reason
            await a.transport.connect("/memory/B/p2p/B")
            b.transport.stall = True
            start = trio.current_time()
            sa.machine.queued = [Send("B", Ping(nonce=2))]
            await a.submit("pinger", None)
            failed = await sa.machine.wait_for(
                lambda e: isinstance(e, SendFailed) and e.message == Ping(nonce=2))
            assert "no ack" in failed.reason
            assert trio.current_time() - start == pytest.approx(SEND_TIMEOUT_S)
            nursery.cancel_scope.cancel()

    run(main)


def test_a_stalled_send_holds_up_its_own_service_only() -> None:
    class ListService(PingService):
        name: ClassVar[str] = "lister"
        message_types = (PeerListRequest, PeerList)
        topics = ()

    async def node(nursery: trio.Nursery, net: FakeNet, peer: str) -> tuple[Driver, Any, Any]:
        driver = Driver(FakeTransport(net, peer), network_id=NET, log=RecordingLog())
        pinger, lister = PingService(), ListService()
        driver.add_service(pinger)
        driver.add_service(lister)
        await nursery.start(driver.run)
        return driver, pinger, lister

    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, a_pinger, a_lister = await node(nursery, net, "A")
            b, b_pinger, b_lister = await node(nursery, net, "B")
            await a.transport.connect("/memory/B/p2p/B")
            b.transport.stalled_types = {Ping}
            start = trio.current_time()
            a_pinger.machine.queued = [Send("B", Ping(nonce=1)), Send("B", Ping(nonce=2))]
            await a.submit("pinger", None)
            a_lister.machine.queued = [Send("B", PeerListRequest(max_peers=5))]
            await a.submit("lister", None)
            await b_lister.machine.wait_for(is_received(PeerListRequest))
            assert trio.current_time() - start < SEND_TIMEOUT_S  # not behind the stalled Ping
            failed = await a_pinger.machine.wait_for(lambda e: isinstance(e, SendFailed))
            assert failed.message == Ping(nonce=1)
            assert trio.current_time() - start == pytest.approx(SEND_TIMEOUT_S)
            # the pinger's own order holds: its second Ping waited for the first
            second = await a_pinger.machine.wait_for(
                lambda e: isinstance(e, SendFailed) and e.message == Ping(nonce=2))
            assert second.peer == "B"
            assert trio.current_time() - start == pytest.approx(2 * SEND_TIMEOUT_S)
            nursery.cancel_scope.cancel()

    run(main)


def test_drained_waits_for_what_one_service_queued_for_one_peer() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, sb, _ = await start_node(nursery, net, "B")
            await a.transport.connect("/memory/B/p2p/B")
            with trio.fail_after(1):  # nothing queued: at once
                await a.drained("pinger", "B")
            b.transport.stalled_types = {Ping}
            start = trio.current_time()
            sa.machine.queued = [Send("B", Ping(nonce=1)), Send("B", Pong(nonce=2))]
            await a.submit("pinger", None)
            with trio.fail_after(1):  # another peer's or service's outbox does not wait
                await a.drained("lister", "B")
                await a.drained("pinger", "C")
            await a.drained("pinger", "B")  # the stalled Ping fails, then the Pong leaves
            assert trio.current_time() - start == pytest.approx(SEND_TIMEOUT_S)
            assert Received("A", Pong(nonce=2)) in sb.machine.seen
            nursery.cancel_scope.cancel()

    run(main)


def test_a_full_outbox_fails_sends_instead_of_growing() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, _, _ = await start_node(nursery, net, "B")
            await a.transport.connect("/memory/B/p2p/B")
            b.transport.stall = True
            sa.machine.queued = [Send("B", Ping(nonce=i)) for i in range(OUTBOX_SIZE + 3)]
            await a.submit("pinger", None)
            await sa.machine.wait_for(
                lambda e: isinstance(e, SendFailed) and e.reason == "outbox full")
            full = [e for e in sa.machine.seen
                    if isinstance(e, SendFailed) and e.reason == "outbox full"]
            # enqueued in one go (no checkpoint between): OUTBOX_SIZE waiting, the rest refused
            assert len(full) == 3
            nursery.cancel_scope.cancel()

    run(main)


def test_dial_connects_outbound_and_a_failed_dial_reports_every_address() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, sb, _ = await start_node(nursery, net, "B")
            sa.machine.queued = [Dial("B", ("/memory/B/p2p/C", "/memory/B"))]
            await a.submit("pinger", None)
            connected = await sa.machine.wait_for(lambda e: isinstance(e, PeerConnected))
            assert connected == PeerConnected("B", ("/memory/B/p2p/B",), True)
            assert await sb.machine.wait_for(lambda e: isinstance(e, PeerConnected)) == \
                PeerConnected("A", (), False)
            sa.machine.queued = [Dial("Z", ("/memory/Z",))]
            await a.submit("pinger", None)
            failed = await sa.machine.wait_for(lambda e: isinstance(e, DialFailed))
            assert failed.peer == "Z" and "refused" in failed.reason
            sa.machine.queued = [Disconnect("B", "test over")]
            await a.submit("pinger", None)
            await sb.machine.wait_for(lambda e: e == PeerDisconnected("A"))
            nursery.cancel_scope.cancel()

    run(main)


def test_gossip_is_published_on_the_network_topic_and_routed_with_its_short_name() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            b, sb, blog = await start_node(nursery, net, "B")
            assert topic(NET, "chatter") in b.transport.subs
            await a.transport.connect("/memory/B/p2p/B")
            sa.machine.queued = [Publish("chatter", Ping(nonce=9))]
            await a.submit("pinger", None)
            got = await sb.machine.wait_for(is_received(Ping))
            assert got == Received("A", Ping(nonce=9), topic="chatter")
            # garbage gossip is penalized against its origin
            await b.transport.subs[topic(NET, "chatter")].send(("A", b"\x93junk"))
            await a.transport.publish(topic(NET, "chatter"), encode(PeerList(peers=())))
            with trio.fail_after(5):
                while b.status()["penalties"].get("A", {}).get("total", 0) < (
                        INVALID_MESSAGE_PENALTY + UNROUTED_MESSAGE_PENALTY):
                    await trio.sleep(0.01)
            assert {p["peer"] for p in blog.events("driver.penalized")} == {"A"}
            nursery.cancel_scope.cancel()

    run(main)


def test_timer_ticks_each_machine_at_its_deadline() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, log = await start_node(nursery, net, "A")
            start = a.now_ms()
            sa.machine.deadline = start + 1500
            await a.submit("pinger", None)  # feeding wakes the timer loop
            await sa.machine.wait_for(lambda e: isinstance(e, Tick))
            assert a.now_ms() == start + 1500
            assert log.events("pinger.ticked") == [{"at": start + 1500}]
            nursery.cancel_scope.cancel()

    run(main)


def test_other_effects_go_to_the_service_in_order() -> None:
    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a, sa, _ = await start_node(nursery, net, "A")
            sa.machine.queued = [StoreThing("x"), Emit("between"), StoreThing("y")]
            await a.submit("pinger", None)
            assert sa.performed == [StoreThing("x"), StoreThing("y")]
            nursery.cancel_scope.cancel()

    run(main)


def test_several_effects_of_one_event_are_performed_inside_the_services_grouping() -> None:
    class GroupingService(PingService):
        @contextmanager
        def performing(self) -> Iterator[None]:
            self.performed.append("begin")
            yield
            self.performed.append("end")

    async def main() -> None:
        net = FakeNet()
        async with trio.open_nursery() as nursery:
            a = Driver(FakeTransport(net, "A"), network_id=NET, log=RecordingLog())
            service = GroupingService()
            a.add_service(service)
            await nursery.start(a.run)
            service.machine.queued = [StoreThing("x"), Emit("between"), StoreThing("y")]
            await a.submit("pinger", None)
            assert service.performed == ["begin", StoreThing("x"), StoreThing("y"), "end"]
            service.performed.clear()
            service.machine.queued = [Emit("alone"), StoreThing("z")]
            await a.submit("pinger", None)
            assert service.performed == [StoreThing("z")]  # one effect: nothing to group
            nursery.cancel_scope.cancel()

    run(main)


def test_two_services_cannot_own_one_message_type() -> None:
    driver = Driver(FakeTransport(FakeNet(), "A"), network_id=NET, log=RecordingLog())
    driver.add_service(PingService())

    class Other(PingService):
        name = "other"

    with pytest.raises(LocalProtocolError, match="Ping is claimed"):
        driver.add_service(Other())


def test_penalty_scores_decay_and_the_book_stays_bounded() -> None:
    book = PenaltyBook()
    assert not book.add("p", "x", PENALTY_BAN_THRESHOLD - 10, now=0)
    # ten minutes later the score has decayed by 100: the same fault no longer bans
    assert not book.add("p", "x", 20, now=10 * 60_000)
    assert book.score("p") == 20
    assert book.add("p", "x", PENALTY_BAN_THRESHOLD, now=10 * 60_000)
    assert book.is_banned("p", now=10 * 60_000 + BAN_MS - 1)
    assert not book.is_banned("p", now=10 * 60_000 + BAN_MS)
    for i in range(MAX_PENALIZED_PEERS + 10):
        book.add(f"q{i}", "x", 1, now=0)
    # full: an eighth of the records (the lowest scores) is forgotten to make room
    assert MAX_PENALIZED_PEERS * 7 // 8 <= len(book.records) <= MAX_PENALIZED_PEERS
