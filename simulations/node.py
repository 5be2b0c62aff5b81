"""A virtual node: one identity hosting protocol machines, as the daemon hosts services.

Contract
--------
* A :class:`MachineSpec` is the simulator's counterpart of ``node.service.Service``: a name, a
  ``build(node)`` that makes the machine (at start and again at every restart, from what the
  node's ``store`` kept), the message types and gossip topics routed to it, and performers for
  its machine-specific effects (``StoreRecord``, ``StartCompute``, ...).
* The node routes a decoded message to the one machine whose ``message_types`` holds its type;
  ``PeerConnected``/``PeerDisconnected`` go to every machine; a ``Tick`` goes to a machine when
  its ``next_deadline()`` has passed. After every ``handle`` the node performs the effects in
  order and re-arms that machine's timer, exactly as node/driver.py does.
* A ``RemoteProtocolError`` out of a machine penalizes the peer it names and the node goes on;
  any other exception is a bug in a machine and stops the simulation loudly.
* Machines see ``now`` as Unix-epoch milliseconds: the virtual clock plus ``swarm.epoch_ms``
  (records carry wall-clock times); deadlines are read back in the same frame.
* ``store`` is the node's data directory: it survives ``crash``/``restart``; machines and
  connections do not. ``epoch`` counts incarnations so that events addressed to a crashed
  incarnation are dropped.
* A node knows the swarm that hosts it only as a :class:`NodeHost` (simulations/swarm.py's
  ``Swarm`` is the one implementation), so this module imports neither the swarm nor the
  transport: imports run swarm -> transport -> node, never back.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from crypto.keys import Identity
from protocol.codec import Message
from protocol.errors import RemoteProtocolError
from protocol.machine import Machine, Memo, PeerConnected, PeerDisconnected, Received, Tick
from simulations.engine import EventLoop
from simulations.metrics import Metrics, Traffic
from simulations.network import NetworkModel

Performer = Callable[["VirtualNode", str, Any], None]

# The driver's penalty rules (node/driver.py), mirrored: scores decay, a threshold bans.
#: penalty points at which a node disconnects a peer and refuses it for BAN_MS
PENALTY_BAN_THRESHOLD = 100
PENALTY_DECAY_PER_MIN = 10
BAN_MS = 10 * 60 * 1000
INVALID_MESSAGE_PENALTY = 10
UNROUTED_MESSAGE_PENALTY = 5
_TICK = Tick()


def nothing_to_perform(node: VirtualNode, name: str, effect: Any) -> None:
    """The performer of an effect that the machine's own state carries out already (a
    ledger's held items are its node's store: simulations/machines/ledger.py); ``feed``
    skips it without calling it."""


@dataclass(frozen=True)
class MachineSpec:
    name: str
    build: Callable[[VirtualNode], Machine]
    message_types: tuple[type[Message], ...] = ()
    topics: tuple[str, ...] = ()
    #: effect type -> performer(node, machine_name, effect) for machine-specific effects
    performers: Mapping[type, Performer] = field(default_factory=dict)
    #: called after every machine of the node is built (submit start-up commands here)
    on_boot: Callable[[VirtualNode], None] | None = None


class PeerDisconnector(Protocol):
    """The part of the transport a node calls itself: closing a connection it penalized."""

    def disconnect(self, node: VirtualNode, peer: str, reason: str) -> None: ...


class NodeHost(Protocol):
    """What a virtual node and the performers of its machines use of the swarm hosting it."""

    seed: int
    #: machines see virtual time plus this (Unix-epoch ms)
    epoch_ms: int
    loop: EventLoop
    net: NetworkModel
    metrics: Metrics
    #: per-node traffic counters, indexed by ``VirtualNode.index``
    traffic: Traffic
    #: what the swarm's machines share of their pure functions' results (simulations/memo.py)
    memo: Memo

    @property
    def transport(self) -> PeerDisconnector: ...

    @property
    def nodes(self) -> Sequence[VirtualNode]: ...

    @property
    def now_ms(self) -> int: ...

    @property
    def machine_now_ms(self) -> int: ...

    def node_of(self, peer: str) -> VirtualNode | None: ...

    def at_ms(self, time_ms: int, callback: Callable[..., None], *args: Any) -> None: ...

    def perform(self, node: VirtualNode, slot: MachineSlot, effect: object) -> None: ...


class MachineSlot:
    """One hosted machine and the time of its armed timer (None: none armed)."""

    __slots__ = ("spec", "machine", "armed_us")

    def __init__(self, spec: MachineSpec, machine: Machine) -> None:
        self.spec = spec
        self.machine = machine
        self.armed_us: int | None = None


class _TrafficCounter:
    """A node's entry in the swarm's per-node traffic array of the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, node: VirtualNode, owner: type | None = None) -> int:
        counts: array[int] = getattr(node.swarm.traffic, self.name)
        return counts[node.index]

    def __set__(self, node: VirtualNode, value: int) -> None:
        counts: array[int] = getattr(node.swarm.traffic, self.name)
        counts[node.index] = value


class VirtualNode:
    # what every delivery reads first, side by side (a swarm's nodes do not fit in the cache)
    __slots__ = (
        "up",
        "topic_slots",
        "swarm",
        "index",
        "identity",
        "peer_id",
        "addr",
        "rng",
        "epoch",
        "specs",
        "slots",
        "routes",
        "store",
        "connections",
        "mesh",
        "scores",
        "banned_until_ms",
        "profile",
        "tags",
    )

    def __init__(
        self,
        swarm: NodeHost,
        index: int,
        identity: Identity,
        rng: random.Random,
        specs: tuple[MachineSpec, ...],
        profile: Any = None,
    ) -> None:
        self.swarm = swarm
        self.index = index
        self.identity = identity
        self.peer_id = identity.peer_id
        self.addr = f"/sim/{index}/p2p/{self.peer_id}"
        self.rng = rng
        self.up = False
        self.epoch = 0
        self.specs = specs
        self.slots: dict[str, MachineSlot] = {}
        self.routes: dict[type, MachineSlot] = {}
        #: topic -> the machines subscribed (a tuple: one object fewer to read per delivery)
        self.topic_slots: dict[str, tuple[MachineSlot, ...]] = {}
        #: survives crashes: namespace -> anything the performers keep there
        self.store: dict[str, Any] = {}
        self.connections: dict[int, bool] = {}  # peer index -> we dialled (outbound)
        self.mesh: dict[str, list[int]] = {}  # topic -> gossip mesh peers
        self.scores: dict[str, tuple[float, int]] = {}  # peer -> (score, updated at ms)
        self.banned_until_ms: dict[str, int] = {}
        #: the node's device/behaviour profile (compute model, adversary role)
        self.profile = profile
        #: free-form labels set by the workload (e.g. "cheater", "sybil")
        self.tags: set[str] = set()

    # traffic counters (kept in the swarm's per-node arrays: the transport bumps them for many
    # nodes at once)
    bytes_sent = _TrafficCounter()
    bytes_received = _TrafficCounter()
    msgs_sent = _TrafficCounter()
    msgs_received = _TrafficCounter()

    # ------------------------------------------------------------------ life cycle

    def boot(self) -> None:
        """(Re)build every machine from ``store`` and mark the node up."""
        self.epoch += 1
        self.up = True
        self.slots = {}
        self.routes = {}
        self.topic_slots = {}
        for spec in self.specs:
            slot = MachineSlot(spec, spec.build(self))
            self.slots[spec.name] = slot
            for message_type in spec.message_types:
                self.routes[message_type] = slot
            for topic in spec.topics:
                self.topic_slots[topic] = (*self.topic_slots.get(topic, ()), slot)
        for slot in self.slots.values():
            self.arm(slot)
        for spec in self.specs:
            if spec.on_boot is not None and self.up:
                spec.on_boot(self)

    def halt(self) -> None:
        self.up = False
        self.slots = {}
        self.routes = {}
        self.topic_slots = {}
        self.connections.clear()
        self.mesh.clear()

    def machine(self, name: str) -> Machine:
        return self.slots[name].machine

    def subscribed(self, topic: str) -> bool:
        return topic in self.topic_slots

    # ------------------------------------------------------------------ feeding events

    def feed(self, slot: MachineSlot, event: object) -> None:
        """Hand ``event`` to one machine now and perform what it returns."""
        swarm = self.swarm
        try:
            effects = slot.machine.handle(event, swarm.loop.now_us // 1000 + swarm.epoch_ms)
        except RemoteProtocolError as exc:
            swarm.metrics.count("remote_protocol_error")
            self.penalize(exc.peer, exc.reason, exc.penalty)
            effects = []
        if effects:
            performers = slot.spec.performers
            for effect in effects:  # (swarm.perform, with the machine's performers in line)
                performer = performers.get(type(effect))
                if performer is None:
                    swarm.perform(self, slot, effect)
                elif performer is not nothing_to_perform:
                    performer(self, slot.spec.name, effect)
        self.arm(slot)

    def feed_all(self, event: object) -> None:
        for slot in list(self.slots.values()):
            if self.up:
                self.feed(slot, event)

    def submit(self, name: str, event: object) -> None:
        """A local command to machine ``name`` (the simulator's ``ctx.submit``)."""
        slot = self.slots.get(name)
        if slot is not None and self.up:
            self.feed(slot, event)

    def deliver(self, sender: str, message: Message, topic: str | None) -> None:
        if topic is None:
            slot = self.routes.get(type(message))
            if slot is None:
                self.swarm.metrics.count("unroutable")
                self.penalize(
                    sender, f"unexpected {type(message).__name__}", UNROUTED_MESSAGE_PENALTY
                )
                return
            self.feed(slot, Received(sender, message, None))
            return
        self.deliver_gossip(Received(sender, message, topic))

    def deliver_gossip(self, event: Received) -> None:
        """A gossip message (``event.topic`` set) to the machines subscribed to its topic."""
        slots = self.topic_slots.get(event.topic)  # type: ignore[arg-type]
        if not slots:
            return
        if len(slots) == 1:  # the usual case: one machine per topic
            slot = slots[0]
            if type(event.message) in slot.spec.message_types:
                self.feed(slot, event)
            return
        kind = type(event.message)
        for slot in slots:
            if kind in slot.spec.message_types:
                self.feed(slot, event)

    def peer_connected(self, peer: str, outbound: bool, addrs: tuple[str, ...]) -> None:
        self.feed_all(PeerConnected(peer, addrs, outbound))

    def peer_disconnected(self, peer: str) -> None:
        self.feed_all(PeerDisconnected(peer))

    # ------------------------------------------------------------------ timers

    def arm(self, slot: MachineSlot) -> None:
        deadline = slot.machine.next_deadline()
        if deadline is None:
            return
        swarm = self.swarm
        loop = swarm.loop
        at_us = (deadline - swarm.epoch_ms) * 1000
        if at_us < loop.now_us:
            at_us = loop.now_us
        armed = slot.armed_us
        if armed is not None and armed <= at_us:
            return  # an earlier (or equal) wake-up is already queued
        slot.armed_us = at_us
        loop.at(at_us, self._wake, slot, self.epoch)

    def _wake(self, slot: MachineSlot, epoch: int) -> None:
        if epoch != self.epoch or not self.up or self.slots.get(slot.spec.name) is not slot:
            return
        now_us = self.swarm.loop.now_us
        if slot.armed_us != now_us:
            return  # superseded by an earlier wake-up that has already re-armed
        slot.armed_us = None
        deadline = slot.machine.next_deadline()
        if deadline is not None and (deadline - self.swarm.epoch_ms) * 1000 <= now_us:
            self.feed(slot, _TICK)
        else:
            self.arm(slot)

    # ------------------------------------------------------------------ penalties

    def penalize(self, peer: str, reason: str, points: int) -> None:
        swarm = self.swarm
        swarm.metrics.count("penalties")
        now = swarm.now_ms
        score, at = self.scores.get(peer, (0.0, now))
        score = max(0.0, score - (now - at) / 60_000 * PENALTY_DECAY_PER_MIN) + points
        self.scores[peer] = (score, now)
        if score >= PENALTY_BAN_THRESHOLD and not self.is_banned(peer):
            self.banned_until_ms[peer] = now + BAN_MS
            swarm.metrics.count("peers_banned")
            swarm.transport.disconnect(self, peer, f"penalized: {reason}")

    def is_banned(self, peer: str) -> bool:
        until = self.banned_until_ms.get(peer)
        return until is not None and until > self.swarm.now_ms
