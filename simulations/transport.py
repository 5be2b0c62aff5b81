"""The simulated transport: connections and unicast over the network model; gossip meshes.

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
* **Gossip meshes** (``Publish``). Each subscribed node keeps a mesh of up to ``degree``
  subscribed neighbours per topic (symmetric, as GRAFT makes it; never above
  ``degree_high``), grafted as connections open and refilled as they close. The publisher
  sends to its mesh or, not subscribed itself, to up to ``degree`` connected subscribers
  (the fanout); simulations/wire/gossip.py carries the message on from there.
* **Fidelity.** Messages cross as objects or, with ``wire_bytes``, as encoded frames each
  receiver decodes (simulations/wire/frames.py). Bytes are counted per node in both modes, on
  the sender's up and the receiver's down side, duplicates included.
"""

from __future__ import annotations

from protocol.codec import Message, encode
from protocol.machine import DialFailed, Received, SendFailed
from simulations.network import SMALL_MESSAGE_BYTES
from simulations.node import MachineSlot, NodeHost, VirtualNode
from simulations.wire.frames import Frames
from simulations.wire.gossip import HopByHop, PlannedFloods, Publication

#: a connect (TCP + Noise + yamux + identify) costs this many round trips
CONNECT_RTTS = 3


class SimTransport:
    def __init__(
        self,
        swarm: NodeHost,
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
        self.frames = Frames(wire_bytes, swarm.metrics, swarm.memo(encode))
        #: small gossip goes by planned floods (simulations/wire/flood.py), the rest hop by hop
        self.floods = PlannedFloods(swarm, self.frames, flood_seed, degree_high)
        self.hops = HopByHop(swarm, self.frames)

    def _account(self, src: VirtualNode, size: int, kind: str) -> None:
        src.bytes_sent += size
        src.msgs_sent += 1
        self.swarm.metrics.add_bytes(kind, size)

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
        swarm.metrics.count("dials")
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
        self.floods.planner.set_incarnation(node.index, None)
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
        self.floods.planner.set_incarnation(node.index, node.epoch)
        self.network_changed()

    def network_changed(self) -> None:
        """Liveness or partitions changed (the mesh's own changes are marked as they happen)."""
        self.floods.network_changed()

    def _mesh_changed(self, index: int, topic: str | None = None) -> None:
        self.floods.mesh_changed(index, topic)

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
        payload, size = self.frames.frame(message)
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
        # opening a stream delays the message; it does not hold the uplink meanwhile
        arrivals = [at + extra for at in swarm.net.transfer(node.index, target.index, size, now)]
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
        message = self.frames.open(target, src, payload)
        if message is not None:
            target.deliver(src.peer_id, message, None)

    def _send_failed(
        self, node: VirtualNode, slot: MachineSlot, peer: str, message: Message, reason: str
    ) -> None:
        if node.up and node.slots.get(slot.spec.name) is slot:
            node.feed(slot, SendFailed(peer, message, reason))

    # ------------------------------------------------------------------ gossip

    def publish(self, node: VirtualNode, topic: str, message: Message) -> None:
        payload, size = self.frames.frame(message)
        self.swarm.metrics.count("gossip_published")
        fanout = None if topic in node.topic_slots else self._fanout(node, topic)
        # without wire bytes every node is handed the same (immutable) event, as it gets the
        # same object
        event = None if self.wire_bytes else Received(node.peer_id, message, topic)
        pub = Publication(node, topic, payload, size, fanout, event)
        if size <= SMALL_MESSAGE_BYTES and (not self.wire_bytes or self.frames.decodes(payload)):
            self.floods.publish(pub)
            return
        # big frames queue on links, and garbage is refused by the first hop: copy by copy
        self.hops.publish(pub)

    def flush_traffic(self) -> None:
        """Count the traffic of planned floods still in flight, for the nodes that have them."""
        self.floods.flush()

    def _fanout(self, node: VirtualNode, topic: str) -> list[int]:
        """A publisher not subscribed to ``topic`` sends to up to ``degree`` connected peers
        that are (gossipsub's fanout set)."""
        nodes = self.swarm.nodes
        peers = [i for i in sorted(node.connections) if topic in nodes[i].topic_slots]
        return peers[: self.degree]
