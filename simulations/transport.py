"""The simulated transport: connections, unicast, gossip over a mesh, over the network model.

Contract (the simulator's side of node/transport.py, at the level of machine effects)
-----------------------------------------------------------------------------------
* **Connections.** ``Dial`` succeeds after a connect time of ``CONNECT_RTTS`` round trips if
  the target is up, reachable (no partition between) and has not banned the dialler; both
  sides then get ``PeerConnected`` (the dialler with ``outbound=True``). Otherwise the
  dialler gets ``DialFailed`` after ``dial_timeout_ms`` (unreachable) or one round trip
  (refused). ``Disconnect`` closes both sides; the remote side learns it after one latency.
  A crashed peer is noticed by its neighbours after ``crash_detect_ms``.
* **Unicast** (``Send``). Delivered once (or twice, with duplication) after the network
  model's delay. A send to a peer we hold no connection to opens a short-lived stream
  first (one extra connect time, no ``PeerConnected``), as libp2p does when it knows the
  peer's address. A send that cannot arrive (peer down, partitioned away, lost) comes back
  to the sender as ``SendFailed`` after ``send_timeout_ms``, like a request that timed out.
* **Gossip** (``Publish``). Each subscribed node keeps a mesh of up to ``degree`` subscribed
  neighbours per topic (symmetric, as GRAFT makes it). The publisher sends to its mesh (or,
  not subscribed itself, to up to ``degree`` connected subscribers: the fanout); a
  node that sees a message for the first time delivers it to its machines (``Received`` with
  ``peer`` = the origin, as node/p2p.py does) and forwards it to its mesh minus the sender;
  later copies are counted in bytes and dropped (the seen-cache). Lost gossip is silent;
  nodes that joined after a message was published never see it by gossip.
* **Planned floods.** A gossip frame of up to ``SMALL_MESSAGE_BYTES`` (nearly all of them)
  is not forwarded copy by copy: simulations/flood.py computes every node's first arrival
  at once, over the same mesh and network model, and each node is handed the message at
  that time, in arrival order (one queued step delivers every arrival that comes before
  anything else queued: ``EventLoop.horizon_us``). A change of mesh, liveness or partition while a flood is in
  flight re-plans it before its next event, so the outcome is the hop-by-hop one: a node
  that is down when its copy arrives neither gets nor forwards it. Bigger frames, which
  queue on links, and frames that do not decode go hop by hop (``_forward``).
* **Fidelity.** With ``wire_bytes`` every message crosses the network as its encoded frame
  and is decoded by each receiver (``InvalidMessage`` penalizes the sender); otherwise the
  object itself travels and its size is ``len(encode(msg))``. Bytes are counted per node in
  both modes, on the sender's up and the receiver's down side, duplicates included; a planned
  flood's when it ends or the run stops.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

import numpy as np

from protocol.codec import Message, decode
from protocol.errors import InvalidMessage
from protocol.machine import DialFailed, Received, SendFailed
from simulations.flood import NEVER, Flood, FloodPlanner, account
from simulations.memo import encode
from simulations.network import SMALL_MESSAGE_BYTES
from simulations.node import INVALID_MESSAGE_PENALTY

if TYPE_CHECKING:
    from simulations.node import MachineSlot, VirtualNode
    from simulations.swarm import Swarm

#: a connect (TCP + Noise + yamux + identify) costs this many round trips
CONNECT_RTTS = 3
#: per-message framing overhead on a stream (length prefix + yamux header)
FRAME_OVERHEAD = 16
#: gossip ids are forgotten this long after publishing (the seen-cache TTL)
SEEN_TTL_US = 120 * 1_000_000


class SimTransport:
    def __init__(
        self,
        swarm: Swarm,
        *,
        wire_bytes: bool = False,
        degree: int = 6,
        degree_high: int = 12,
        dial_timeout_ms: int = 10_000,
        send_timeout_ms: int = 10_000,
        crash_detect_ms: int = 5_000,
        flood_seed: int = 0,
    ) -> None:
        self.swarm = swarm
        self.wire_bytes = wire_bytes
        self.degree = degree
        self.degree_high = degree_high
        self.dial_timeout_us = dial_timeout_ms * 1000
        self.send_timeout_us = send_timeout_ms * 1000
        self.crash_detect_us = crash_detect_ms * 1000
        #: gossip id -> the message in flight, until the seen-cache forgets it (see below)
        self._seen: dict[int, _Gossip] = {}
        self._next_gossip_id = 0
        #: small gossip goes by planned floods (simulations/flood.py)
        self.planner = FloodPlanner(swarm.net, flood_seed, degree_high)
        self._floods: list[Flood] = []
        #: the network changed while floods were in flight: re-plan them before the next
        #: flood event (after the change is complete: a crash closes many links at once)
        self._stale = False

    # ------------------------------------------------------------------ sizes

    def _frame(self, message: Message) -> tuple[object, int]:
        """What crosses the wire and its size in bytes."""
        data = encode(message)
        if self.wire_bytes:
            return data, len(data) + FRAME_OVERHEAD
        return message, len(data) + FRAME_OVERHEAD

    def _account(self, src: VirtualNode, size: int, kind: str) -> None:
        src.bytes_sent += size
        src.msgs_sent += 1
        self.swarm.metrics.add_bytes(kind, size)

    def _open(self, dst: VirtualNode, src: VirtualNode, payload: object) -> Message | None:
        if not self.wire_bytes:
            return payload  # type: ignore[return-value]
        try:
            return decode(payload)  # type: ignore[arg-type]
        except InvalidMessage as exc:
            self.swarm.metrics.count("invalid_frames")
            dst.penalize(src.peer_id, f"invalid message: {exc}", INVALID_MESSAGE_PENALTY)
            return None

    # ------------------------------------------------------------------ connections

    def connect_now(self, a: VirtualNode, b: VirtualNode) -> None:
        """Open a connection at once (static topologies); both sides get PeerConnected."""
        if a is b or b.index in a.connections or not (a.up and b.up):
            return
        a.connections[b.index] = True
        b.connections[a.index] = False
        self._graft(a, b)
        a.peer_connected(b.peer_id, True, (b.addr,))
        if b.up and a.up and a.index in b.connections:
            b.peer_connected(a.peer_id, False, (a.addr,))

    def dial(self, node: VirtualNode, peer: str) -> None:
        swarm = self.swarm
        target = swarm.node_of(peer)
        loop = swarm.loop
        if target is None or target is node:
            loop.after(self.dial_timeout_us, self._dial_failed, node, node.epoch, peer, "no route")
            return
        if target.index in node.connections:
            loop.after(0, self._dial_done, node, node.epoch, target, target.epoch)
            return
        rtt = swarm.net.rtt_us(node.index, target.index)
        if not target.up or not swarm.net.reachable(node.index, target.index):
            loop.after(self.dial_timeout_us, self._dial_failed, node, node.epoch, peer, "timeout")
            return
        if target.is_banned(node.peer_id):
            loop.after(rtt, self._dial_failed, node, node.epoch, peer, "refused")
            return
        loop.after(CONNECT_RTTS * rtt, self._dial_done, node, node.epoch, target, target.epoch)

    def _dial_done(self, node: VirtualNode, epoch: int, target: VirtualNode, t_epoch: int) -> None:
        if node.epoch != epoch or not node.up:
            return
        if target.epoch != t_epoch or not target.up:
            self._dial_failed(node, epoch, target.peer_id, "peer went away")
            return
        if target.index in node.connections:
            node.peer_connected(target.peer_id, True, (target.addr,))
            return
        self.connect_now(node, target)

    def _dial_failed(self, node: VirtualNode, epoch: int, peer: str, reason: str) -> None:
        if node.epoch == epoch and node.up:
            self.swarm.metrics.count("dial_failed")
            node.feed_all(DialFailed(peer, reason))

    def disconnect(self, node: VirtualNode, peer: str, reason: str) -> None:
        swarm = self.swarm
        other = swarm.node_of(peer)
        if other is None or other.index not in node.connections:
            return
        self._close(node, other)
        node.peer_disconnected(peer)
        delay = swarm.net.base_latency_us(node.index, other.index)
        swarm.loop.after(delay, self._remote_closed, other, other.epoch, node)

    def _close(self, a: VirtualNode, b: VirtualNode) -> None:
        a.connections.pop(b.index, None)
        b.connections.pop(a.index, None)
        for mesh in a.mesh.values():
            if b.index in mesh:
                mesh.remove(b.index)
        for mesh in b.mesh.values():
            if a.index in mesh:
                mesh.remove(a.index)
        self._mesh_changed(a.index)
        self._mesh_changed(b.index)
        self._refill(a)
        self._refill(b)

    def _remote_closed(self, other: VirtualNode, epoch: int, node: VirtualNode) -> None:
        if other.epoch == epoch and other.up:
            other.peer_disconnected(node.peer_id)

    def node_down(self, node: VirtualNode, *, graceful: bool) -> None:
        """Close every connection of a node that leaves (graceful) or crashes."""
        swarm = self.swarm
        self.planner.set_incarnation(node.index, None)
        self._mesh_changed(node.index)
        for index in sorted(node.connections):
            other = swarm.nodes[index]
            self._close(node, other)
            delay = (
                swarm.net.base_latency_us(node.index, index) if graceful else self.crash_detect_us
            )
            swarm.loop.after(delay, self._remote_closed, other, other.epoch, node)

    def node_up(self, node: VirtualNode) -> None:
        """A node (re)started: floods in flight must not count on its old incarnation."""
        self.planner.set_incarnation(node.index, node.epoch)
        self.network_changed()

    def network_changed(self) -> None:
        """Liveness or partitions changed (the mesh's own changes are marked as they happen)."""
        if self._floods:
            self._stale = True

    def _mesh_changed(self, index: int, topic: str | None = None) -> None:
        self.planner.touch(index, topic)
        self.network_changed()

    # ------------------------------------------------------------------ gossip mesh

    def _graft(self, a: VirtualNode, b: VirtualNode) -> None:
        for topic in a.topic_slots:
            if topic not in b.topic_slots:
                continue
            ma = a.mesh.setdefault(topic, [])
            mb = b.mesh.setdefault(topic, [])
            if (len(ma) < self.degree or len(mb) < self.degree) and (
                len(ma) < self.degree_high and len(mb) < self.degree_high
            ):
                ma.append(b.index)
                mb.append(a.index)
                self._mesh_changed(a.index, topic)
                self._mesh_changed(b.index, topic)

    def _refill(self, node: VirtualNode) -> None:
        nodes = self.swarm.nodes
        for topic, mesh in node.mesh.items():
            if len(mesh) >= self.degree:
                continue
            for index in sorted(node.connections):
                if len(mesh) >= self.degree:
                    break
                other = nodes[index]
                if index in mesh or topic not in other.topic_slots:
                    continue
                om = other.mesh.setdefault(topic, [])
                if len(om) < self.degree_high:
                    mesh.append(index)
                    om.append(node.index)
                    self._mesh_changed(node.index, topic)
                    self._mesh_changed(index, topic)

    # ------------------------------------------------------------------ unicast

    def send(self, node: VirtualNode, slot: MachineSlot, peer: str, message: Message) -> None:
        swarm = self.swarm
        loop = swarm.loop
        target = swarm.node_of(peer)
        payload, size = self._frame(message)
        self._account(node, size, type(message).__name__)
        if target is None or target is node:
            loop.after(
                self.send_timeout_us, self._send_failed, node, slot, peer, message, "no route"
            )
            return
        now = loop.now_us
        extra = 0
        if target.index not in node.connections:
            extra = CONNECT_RTTS * swarm.net.rtt_us(node.index, target.index)
        if not target.up or not swarm.net.reachable(node.index, target.index):
            loop.after(
                self.send_timeout_us, self._send_failed, node, slot, peer, message, "timeout"
            )
            return
        arrivals = swarm.net.transfer(node.index, target.index, size, now + extra)
        if not arrivals:
            swarm.metrics.count("unicast_lost")
            loop.after(self.send_timeout_us, self._send_failed, node, slot, peer, message, "lost")
            return
        for at in arrivals:
            loop.at(at, self._arrive, target, target.epoch, node, payload, size)

    def _arrive(
        self, target: VirtualNode, epoch: int, src: VirtualNode, payload: object, size: int
    ) -> None:
        if target.epoch != epoch or not target.up:
            return
        if not self.swarm.net.reachable(src.index, target.index):
            return  # a partition that began while the message was in flight
        target.bytes_received += size
        target.msgs_received += 1
        if target.is_banned(src.peer_id):
            return
        message = self._open(target, src, payload)
        if message is not None:
            target.deliver(src.peer_id, message, None)

    def _send_failed(
        self, node: VirtualNode, slot: MachineSlot, peer: str, message: Message, reason: str
    ) -> None:
        if node.up and node.slots.get(slot.spec.name) is slot:
            node.feed(slot, SendFailed(peer, message, reason))

    # ------------------------------------------------------------------ gossip
    #
    # Per published message (a ``_Gossip``), ``arrival[i]`` is 0 (nothing on its way to node
    # i), the earliest scheduled arrival time + 1, or -1 once node i has seen the message. A
    # copy that would arrive after one already on its way is a duplicate for sure: its bytes
    # are counted at once and no event is scheduled for it (most copies in a mesh are such
    # duplicates).

    def publish(self, node: VirtualNode, topic: str, message: Message) -> None:
        swarm = self.swarm
        payload, size = self._frame(message)
        swarm.metrics.count("gossip_published")
        if size <= SMALL_MESSAGE_BYTES and (not self.wire_bytes or self._decodes(payload)):
            self._plan(node, topic, message, payload, size)
            return
        # big frames queue on links, and garbage is refused by the first hop: copy by copy
        gid = self._next_gossip_id
        self._next_gossip_id += 1
        gossip = _Gossip(topic, node.peer_id, payload, size, len(swarm.nodes))
        if not self.wire_bytes:
            # every node is handed the same (immutable) event, as it gets the same object
            gossip.event = Received(node.peer_id, message, topic)
        gossip.arrival[node.index] = -1
        self._seen[gid] = gossip
        swarm.loop.after(SEEN_TTL_US, self._forget, gid)
        self._forward(node, -1, gossip)

    # ------------------------------------------------------------------ planned floods

    def _decodes(self, payload: object) -> bool:
        try:
            decode(payload)  # type: ignore[arg-type]
        except InvalidMessage:
            return False
        return True

    def _plan(
        self, node: VirtualNode, topic: str, message: Message, payload: object, size: int
    ) -> None:
        if self._stale:
            self._replan()
        swarm = self.swarm
        flood = Flood(topic, node.peer_id, node.index, payload, size, len(swarm.nodes))
        if not self.wire_bytes:
            # every node is handed the same (immutable) event, as it gets the same object
            flood.event = Received(node.peer_id, message, topic)
        fanout = None if topic in node.topic_slots else self._fanout(node, topic)
        self.planner.plan(flood, swarm.loop.now_us, swarm.nodes, fanout)
        self._floods.append(flood)
        self._schedule(flood)

    def _schedule(self, flood: Flood) -> None:
        """Line up the nodes still to get ``flood`` by arrival and queue the first: each step
        delivers as many in a row as come before anything else queued (``horizon_us``)."""
        arrival = flood.arrival
        pending = np.flatnonzero((arrival < NEVER) & ~flood.have())
        order = pending[np.argsort(arrival[pending], kind="stable")]
        flood.order = order.tolist()
        flood.order_times = arrival[order].tolist()
        flood.pos = 0
        flood.generation += 1
        if flood.order:
            self.swarm.loop.at(flood.order_times[0], self._flood_step, flood, flood.generation)
        else:
            self._flood_done(flood)

    def _replan(self) -> None:
        self._stale = False
        swarm = self.swarm
        now = swarm.loop.now_us
        for flood in list(self._floods):
            self.planner.replan(flood, now, swarm.nodes)
            self._schedule(flood)

    def _flood_step(self, flood: Flood, generation: int) -> None:
        if self._stale:
            self._replan()
        if flood.generation != generation:
            return  # re-planned: a newer step is queued
        loop = self.swarm.loop
        nodes = self.swarm.nodes
        order = flood.order
        times = flood.order_times
        delivered = flood.delivered
        event = flood.event
        pos = flood.pos
        while True:
            index = order[pos]
            pos += 1
            flood.pos = pos
            delivered[index] = 1
            target = nodes[index]
            if target.up:
                if event is None:
                    self._deliver_frame(flood, target)
                else:
                    target.deliver_gossip(event)
            if self._stale:
                self._replan()  # what it did changed the network: the rest is re-planned
                return
            if flood.generation != generation:
                return
            if pos == len(order):
                self._flood_done(flood)
                return
            at = times[pos]
            if at >= loop.horizon_us():
                loop.at(at, self._flood_step, flood, generation)
                return
            loop.advance(at)

    def _deliver_frame(self, flood: Flood, target: VirtualNode) -> None:
        """Wire bytes: every receiver decodes its own copy."""
        sender = self.swarm.nodes[int(flood.parent[target.index])]
        message = self._open(target, sender, flood.payload)
        if message is not None:
            target.deliver_gossip(Received(flood.origin, message, flood.topic))

    def _flood_done(self, flood: Flood) -> None:
        """Every node the flood reaches has it (and has sent its copies on)."""
        self._account_flood(flood)
        self._floods.remove(flood)

    def _account_flood(self, flood: Flood) -> None:
        sent, received, total_sent, total_received, firsts = account(flood)
        if not total_sent and not total_received:
            return
        n = flood.n
        size = flood.size
        traffic = self.swarm.traffic
        for counter, counts, unit in (
            (traffic.bytes_sent, sent, size),
            (traffic.msgs_sent, sent, 1),
            (traffic.bytes_received, received, size),
            (traffic.msgs_received, received, 1),
        ):
            view = np.frombuffer(counter, dtype=np.int64)
            view[:n] += counts * unit
            del view  # an exported buffer would stop the array from growing
        metrics = self.swarm.metrics
        if total_sent:
            metrics.add_bytes("gossip", total_sent * size)
        if total_received > firsts:
            metrics.count("gossip_duplicates", total_received - firsts)

    def flush_traffic(self) -> None:
        """Count the traffic of floods still in flight, for the nodes that have them so far."""
        for flood in self._floods:
            self._account_flood(flood)

    def _forward(self, node: VirtualNode, came_from: int, gossip: _Gossip) -> None:
        topic = gossip.topic
        mesh = node.mesh.get(topic)
        if came_from == -1 and topic not in node.topic_slots:
            mesh = self._fanout(node, topic)
        if not mesh:
            return
        swarm = self.swarm
        nodes = swarm.nodes
        arrival = gossip.arrival
        if len(arrival) < len(nodes):  # nodes added since: they never see it (as seen)
            arrival.extend([-1] * (len(nodes) - len(arrival)))
        size = gossip.size
        src = node.index
        loop = swarm.loop
        traffic = swarm.traffic
        first, duplicates = swarm.net.flood_hop(
            src,
            mesh,
            came_from,
            arrival,
            size,
            loop.now_us,
            traffic.bytes_received,
            traffic.msgs_received,
        )
        if first:
            schedule = loop.at
            arrive = self._gossip_arrive
            for index, at in first:
                target = nodes[index]
                schedule(at, arrive, target, target.epoch, src, gossip)
        sent = len(mesh) - 1 if came_from in mesh else len(mesh)
        if sent:
            traffic.bytes_sent[src] += size * sent
            traffic.msgs_sent[src] += sent
            swarm.metrics.add_bytes("gossip", size * sent)
        if duplicates:
            swarm.metrics.count("gossip_duplicates", duplicates)

    def _forget(self, gid: int) -> None:
        gossip = self._seen.pop(gid, None)
        if gossip is not None:
            gossip.forgotten = True

    def _fanout(self, node: VirtualNode, topic: str) -> list[int]:
        """A publisher not subscribed to ``topic`` sends to up to ``degree`` connected peers
        that are (gossipsub's fanout set)."""
        nodes = self.swarm.nodes
        peers = [i for i in sorted(node.connections) if topic in nodes[i].topic_slots]
        return peers[: self.degree]

    def _gossip_arrive(self, target: VirtualNode, epoch: int, src: int, gossip: _Gossip) -> None:
        if target.epoch != epoch or not target.up:
            return
        index = target.index
        traffic = self.swarm.traffic
        traffic.bytes_received[index] += gossip.size
        traffic.msgs_received[index] += 1
        arrival = gossip.arrival
        if gossip.forgotten or arrival[index] != self.swarm.loop.now_us + 1:
            self.swarm.metrics.count("gossip_duplicates")
            return
        arrival[index] = -1
        event = gossip.event
        if event is None:
            message = self._open(target, self.swarm.nodes[src], gossip.payload)
            if message is None:
                return
            event = Received(gossip.origin, message, gossip.topic)
        self._forward(target, src, gossip)
        if gossip.origin != target.peer_id:
            target.deliver_gossip(event)


class _Gossip:
    """One published message on its way through the mesh (see the comment above)."""

    __slots__ = ("topic", "origin", "payload", "size", "arrival", "event", "forgotten")

    def __init__(self, topic: str, origin: str, payload: object, size: int, nodes: int) -> None:
        self.topic = topic
        self.origin = origin
        self.payload = payload
        self.size = size
        self.arrival = array("q", bytes(8 * nodes))
        #: the event every node is handed (None with wire bytes: each node decodes its copy)
        self.event: Received | None = None
        #: past the seen-cache TTL: later copies are duplicates
        self.forgotten = False
