"""The driver: runs every service's sans-IO machine over a real transport.

What it promises (services and their machines may rely on it)
-------------------------------------------------------------
* Routing. Each wire message type belongs to exactly one service (``Service.message_types``;
  two owners is a ``LocalProtocolError`` at start). A decoded unicast message, or a gossip
  message on one of the owner's ``topics``, is fed to that machine as ``Received``.
  ``PeerConnected``/``PeerDisconnected`` go to every machine, in registration order.
* Unicast. One request/response protocol per network, ``protocol_id(net, "msg")``, carries
  every ``Send``: the request is the encoded message, the response an empty ack (or a short
  refusal reason). The handshake types (``Hello``) travel on the network-independent
  ``HANDSHAKE_PROTOCOL_ID`` instead, so that two nodes of different networks can still tell
  each other why they part. Sends from one service to one peer leave in order, one at a time,
  from a bounded outbox of that peer and service (another service's sends to the peer do not
  wait for them); a failure, a refusal, a timeout (``SEND_TIMEOUT_S``) or a full outbox comes
  back to the sending machine as ``SendFailed``.
* Gossip. A service's short topic names are subscribed as ``names.topic(net, short)``;
  ``Publish(short, msg)`` is queued (bounded, best effort) and published in order.
* Timers. One loop feeds ``Tick`` to every machine whose ``next_deadline()`` has passed; it
  wakes whenever a machine was fed (its deadline may have moved). Time is integer
  milliseconds of trio's clock (:meth:`Driver.now_ms`).
* Effects. ``Send``, ``Publish``, ``Dial`` (addresses dialed side by side, staggered:
  node/runtime/dialing.py; ``DialFailed`` back to the dialing machine), ``Disconnect``,
  ``Penalize`` and ``Emit`` (a structured log line ``<service>.<event>``) are performed
  here and never wait on the network; every other effect is awaited in ``service.perform``
  in order. When one event gives a service two or more of
  those, they are performed inside ``service.performing()`` (the ledger writes a pulled batch
  in one SQLite transaction there).
* Peers' faults. Undecodable bytes (``InvalidMessage``), a message no service owns, or a
  ``RemoteProtocolError`` raised by a machine or a service: the peer is penalized and logged
  with its id, and the node keeps running. So are the faults the transport reports on any
  inbound stream (bad framing, oversize, stalls, floods of streams: ``on_fault``) and, on our
  unicast protocol, floods and replays beyond ``NetLimits`` (node/runtime/intake.py): a flood
  is refused before decoding, a replay of a message type that is not ``repeatable`` right
  after. Costs: node/penalties.py. Each peer's faults
  are logged once per kind, then summarized at most once per
  ``NetLimits.log_summary_interval_s`` (node/logs.RepeatLog); a ban is always logged. Scores decay; over the threshold the peer is
  disconnected and banned for a while (node/penalties.py): its connections are closed at
  once, its messages refused, dials to it fail with ``DialFailed("banned")``.

The outboxes live in node/runtime/unicast.py, the publish queue in node/runtime/publish.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import trio

from node.logs import RepeatLog, log_emit
from node.penalties import BAN_MS, FAULT_PENALTIES, PenaltyBook
from node.runtime.dialing import dial_first, dial_plan
from node.runtime.intake import PeerIntake
from node.runtime.limits import NetLimits
from node.runtime.publish import PublishQueue
from node.runtime.unicast import HANDSHAKE_PROTOCOL_ID, HANDSHAKE_TYPES, MSG_PROTOCOL_NAME, Outboxes
from node.service import Service
from protocol.codec import MAX_FRAME_BYTES, Message, decode
from protocol.errors import InvalidMessage, LocalProtocolError, RemoteProtocolError
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
    Tick,
)
from protocol.names import protocol_id, topic

INVALID_MESSAGE_PENALTY = FAULT_PENALTIES["undecodable"]
UNROUTED_MESSAGE_PENALTY = 5
#: effects the driver performs itself; any other goes to the service's ``perform``
_DRIVER_EFFECTS = (Send, Publish, Emit, Penalize, Dial, Disconnect)


@dataclass
class PeerState:
    connected_at_ms: int
    outbound: bool
    addrs: tuple[str, ...]


class Driver:
    def __init__(self, transport: Any, *, network_id: str, log: Any,
                 limits: NetLimits | None = None) -> None:
        limits = NetLimits() if limits is None else limits
        self.transport = transport
        self.network_id = network_id
        self.log = log
        #: registration order = the order peer events reach machines
        self.services: dict[str, Service] = {}
        self._routes: dict[type[Message], str] = {}
        self._topics: dict[str, str] = {}  # full topic -> short name
        self._msg_protocol = protocol_id(network_id, MSG_PROTOCOL_NAME)
        self._peers: dict[str, PeerState] = {}
        self._dialing: dict[str, str] = {}  # peer -> address being dialled
        self._dialled: dict[str, str] = {}  # peer -> address that connected, until its event
        self.penalties = PenaltyBook()
        self._intake = PeerIntake(limits)
        #: faults seen, by kind (stream faults from the transport, floods and replays here)
        self.faults: dict[str, int] = {}
        self._fault_log = RepeatLog(log, interval_ms=int(limits.log_summary_interval_s * 1000))
        self._nursery: trio.Nursery | None = None
        self._wake = trio.Event()
        self._peer_events: Any = None
        self.counters = {"received": 0, "sent": 0, "send_failed": 0, "invalid": 0,
                         "published": 0, "publish_dropped": 0, "gossip_received": 0,
                         "refused_flood": 0, "refused_replay": 0}
        self._outboxes = Outboxes(
            transport, self._msg_protocol, feed=self._feed, spawn=self._spawn,
            is_connected=self._peers.__contains__, counters=self.counters, log=log)
        self.drained = self._outboxes.drained  # NodeContext.drained
        self._publishes = PublishQueue(transport, network_id, counters=self.counters, log=log,
                                       now_ms=self.now_ms)

    # ---- setup ----------------------------------------------------------------------------

    def add_service(self, service: Service) -> None:
        if service.name in self.services:
            raise LocalProtocolError(f"two services named {service.name!r}")
        for message_type in service.message_types:
            owner = self._routes.get(message_type)
            if owner is not None:
                raise LocalProtocolError(
                    f"{message_type.__name__} is claimed by {owner!r} and {service.name!r}")
            self._routes[message_type] = service.name
        for short in service.topics:
            self._topics[topic(self.network_id, short)] = short
        self.services[service.name] = service

    def install(self) -> None:
        """Serve our protocols and take the peer events; call before the transport listens."""
        self.transport.set_request_handler(
            self._msg_protocol, self._on_message, max_request_bytes=MAX_FRAME_BYTES)
        self.transport.set_request_handler(
            HANDSHAKE_PROTOCOL_ID, self._on_handshake, max_request_bytes=MAX_FRAME_BYTES)
        self.transport.set_fault_handler(self.on_fault)
        self._peer_events = self.transport.peer_events()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe the topics and run the pumps and the timer loop until cancelled."""
        if self._peer_events is None:
            self.install()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for full in self._topics:
                channel = await self.transport.subscribe(full)
                nursery.start_soon(self._gossip_pump, full, channel)
            nursery.start_soon(self._peer_pump)
            nursery.start_soon(self._publishes.run)
            nursery.start_soon(self._timer_loop)
            task_status.started()

    # ---- time and feeding -----------------------------------------------------------------

    @staticmethod
    def now_ms() -> int:
        return int(trio.current_time() * 1000)

    async def submit(self, name: str, event: object) -> None:
        """Feed a local event to service ``name``'s machine and perform its effects."""
        if name not in self.services:
            raise LocalProtocolError(f"no service named {name!r}")
        await self._feed(name, event)

    async def _feed(self, name: str, event: object) -> None:
        service = self.services[name]
        try:
            effects = service.machine.handle(event, self.now_ms())
        except RemoteProtocolError as exc:
            self.penalize(exc.peer, exc.reason, exc.penalty)
            return
        except Exception:
            self.log.exception("driver.machine_error", service=name, event=type(event).__name__)
            return
        finally:
            self._wake.set()
        with self._performing(service, effects):
            for effect in effects:
                await self._perform(name, effect)

    @staticmethod
    def _performing(service: Service, effects: list[object]) -> AbstractContextManager[object]:
        """The service's grouping of its effects (one transaction, say) when it gets several."""
        own = 0
        for effect in effects:
            if not isinstance(effect, _DRIVER_EFFECTS):
                own += 1
                if own > 1:
                    return service.performing()
        return nullcontext()

    async def _perform(self, name: str, effect: object) -> None:
        if isinstance(effect, Send):
            self._outboxes.enqueue(name, effect.peer, effect.message)
        elif isinstance(effect, Publish):
            self._publishes.enqueue(effect.topic, effect.message)
        elif isinstance(effect, Emit):
            log_emit(self.log, name, effect.event, effect.fields)
        elif isinstance(effect, Penalize):
            self.penalize(effect.peer, effect.reason, effect.points)
        elif isinstance(effect, Dial):
            self._start_dial(name, effect.peer, effect.addrs)
        elif isinstance(effect, Disconnect):
            self.log.info("driver.disconnect", peer=effect.peer, reason=effect.reason, by=name)
            self._spawn(self._disconnect, effect.peer)
        else:
            try:
                await self.services[name].perform(effect)
            except RemoteProtocolError as exc:
                self.penalize(exc.peer, exc.reason, exc.penalty)
            except Exception:
                self.log.exception("driver.perform_error", service=name,
                                   effect=type(effect).__name__)
            self._wake.set()

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is None:
            raise LocalProtocolError("the driver is not running yet")
        self._nursery.start_soon(fn, *args)

    async def _timer_loop(self) -> None:
        while True:
            self._wake = trio.Event()
            now = self.now_ms()
            deadlines = {n: s.machine.next_deadline() for n, s in self.services.items()}
            due = [n for n, d in deadlines.items() if d is not None and d <= now]
            for name in due:
                await self._feed(name, Tick())
            if due:
                continue
            pending = [d for d in deadlines.values() if d is not None]
            # +0.5 ms: waking at the deadline must make now_ms() >= it despite float rounding
            wake_at = (min(pending) + 0.5) / 1000 if pending else float("inf")
            with trio.move_on_at(wake_at):
                await self._wake.wait()

    # ---- unicast --------------------------------------------------------------------------

    async def _on_message(self, peer: str, data: bytes) -> bytes:
        return await self._on_request(peer, data, handshake=False)

    async def _on_handshake(self, peer: str, data: bytes) -> bytes:
        return await self._on_request(peer, data, handshake=True)

    async def _on_request(self, peer: str, data: bytes, *, handshake: bool) -> bytes:
        if self.is_banned(peer):
            return b"banned"
        if (fault := self._intake.admit(peer, self.now_ms())) is not None:
            return self._refuse(peer, fault, f"a {len(data)}-byte message")
        try:
            message: Message = decode(data)
        except InvalidMessage as exc:
            self.counters["invalid"] += 1
            self.penalize(peer, f"invalid message: {exc}", INVALID_MESSAGE_PENALTY,
                          kind="undecodable")
            return b"invalid message"
        fault = None if message.repeatable else self._intake.replayed(peer, data, self.now_ms())
        if fault is not None:
            return self._refuse(peer, fault, f"a {len(data)}-byte {type(message).__name__}")
        owner = self._routes.get(type(message))
        if owner is None or (handshake and type(message) not in HANDSHAKE_TYPES):
            self.penalize(peer, f"unexpected {type(message).__name__}", UNROUTED_MESSAGE_PENALTY,
                          kind="unexpected")
            return b"unexpected message type"
        self.counters["received"] += 1
        await self._feed(owner, Received(peer, message))
        return b""

    def _refuse(self, peer: str, fault: str, what: str) -> bytes:
        self.counters[f"refused_{fault}"] += 1
        self.on_fault(peer, fault, what)
        return fault.encode()

    # ---- gossip ---------------------------------------------------------------------------

    async def _gossip_pump(self, full: str, channel: Any) -> None:
        short = self._topics[full]
        async for origin, data in channel:
            if self.is_banned(origin):
                continue
            try:
                message: Message = decode(data)
            except InvalidMessage as exc:
                self.counters["invalid"] += 1
                self.penalize(origin, f"invalid gossip on {short}: {exc}",
                              INVALID_MESSAGE_PENALTY, kind="undecodable")
                continue
            owner = self._routes.get(type(message))
            if owner is None or short not in self.services[owner].topics:
                self.penalize(origin, f"unexpected {type(message).__name__} on {short}",
                              UNROUTED_MESSAGE_PENALTY, kind="unexpected")
                continue
            self.counters["gossip_received"] += 1
            await self._feed(owner, Received(origin, message, topic=short))

    # ---- peers ----------------------------------------------------------------------------

    async def _peer_pump(self) -> None:
        async for event in self._peer_events:
            peer = event.peer_id
            if event.connected:
                if self.is_banned(peer):
                    self.log.info("driver.refused_banned", peer=peer)
                    self._spawn(self._disconnect, peer)
                    continue
                dialled = self._dialing.get(peer) or self._dialled.pop(peer, None)
                state = PeerState(self.now_ms(), dialled is not None,
                                  (dialled,) if dialled else ())
                self._peers[peer] = state
                event_out: object = PeerConnected(peer, state.addrs, state.outbound)
            else:
                self._dialled.pop(peer, None)
                if self._peers.pop(peer, None) is None:
                    continue
                self._outboxes.close(peer)
                event_out = PeerDisconnected(peer)
            for name in list(self.services):
                await self._feed(name, event_out)

    def _start_dial(self, name: str, peer: str, addrs: Iterable[str]) -> None:
        if peer in self._peers or peer in self._dialing:
            return
        if self.is_banned(peer):
            self._spawn(self._feed, name, DialFailed(peer, "banned"))
            return
        self._spawn(self._dial, name, peer, tuple(addrs))

    async def _dial(self, name: str, peer: str, addrs: tuple[str, ...]) -> None:
        plan, errors = dial_plan(peer, addrs)
        if plan:
            self._dialing[peer] = plan[0]  # the connect event may come before the winner is known
            try:
                outcome = await dial_first(self.transport.connect, plan)
            finally:
                self._dialing.pop(peer, None)
            if outcome.addr is not None:
                if peer in self._peers and self._peers[peer].outbound:
                    self._peers[peer].addrs = (outcome.addr,)
                elif peer not in self._peers:
                    self._dialled[peer] = outcome.addr
                return
            errors += outcome.errors
        reason = "; ".join(errors) or "no address to dial"
        self.log.debug("driver.dial_failed", peer=peer, reason=reason)
        await self._feed(name, DialFailed(peer, reason))

    async def _disconnect(self, peer: str) -> None:
        try:
            await self.transport.disconnect(peer)
        except Exception as exc:  # the peer may be gone already; disconnecting is best effort
            self.log.debug("driver.disconnect_failed", peer=peer, error=repr(exc))

    # ---- penalties ------------------------------------------------------------------------

    def on_fault(self, peer: str, kind: str, detail: str) -> None:
        """A peer's fault of ``kind`` (a key of FAULT_PENALTIES), seen by the transport or here."""
        self.faults[kind] = self.faults.get(kind, 0) + 1
        self.penalize(peer, f"{kind}: {detail}", FAULT_PENALTIES[kind], kind=kind)

    def penalize(self, peer: str, reason: str, points: int, *, kind: str = "invalid") -> None:
        """Add ``points`` to ``peer``'s score (ban past the threshold); log it once per kind."""
        now = self.now_ms()
        banned = self.penalties.add(peer, reason, points, now)
        self._fault_log.note((peer, kind), now, "driver.penalized", peer=peer, reason=reason,
                             points=points, score=round(self.penalties.score(peer), 1))
        if banned:
            self.log.warning("driver.banned", peer=peer, ban_s=BAN_MS // 1000, reason=reason)
            if self._nursery is not None:
                self._spawn(self._disconnect, peer)

    def is_banned(self, peer: str) -> bool:
        return self.penalties.is_banned(peer, self.now_ms())

    # ---- status ---------------------------------------------------------------------------

    def connected(self) -> dict[str, PeerState]:
        return dict(self._peers)

    def status(self) -> dict[str, Any]:
        now = self.now_ms()
        return {
            "connected": {p: {"connected_s": round((now - s.connected_at_ms) / 1000, 3),
                              "outbound": s.outbound, "addrs": list(s.addrs)}
                          for p, s in self._peers.items()},
            **self.penalties.status(now),
            "counters": dict(self.counters),
            "faults": dict(self.faults),
            "log_lines_suppressed": self._fault_log.suppressed,
        }
