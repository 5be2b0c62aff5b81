"""Gossip over the simulated mesh: planned floods for small frames, hop by hop for the rest.

Contract (the simulator's side of gossipsub, at the level of ``Publish`` effects)
--------------------------------------------------------------------------------
* The transport (simulations/transport.py) keeps each node's mesh per topic and hands every
  ``Publish`` here with the peers the publisher sends to: its mesh, or, not subscribed
  itself, its fanout. A node that sees a message for the first time delivers it to its
  machines (``Received`` with ``peer`` = the origin, as node/p2p.py does) and forwards it to
  its mesh minus the sender; later copies are counted in bytes and dropped (the seen-cache).
  Lost gossip is silent; nodes that joined after a message was published never see it.
* **Planned floods** (:class:`PlannedFloods`). A frame of up to ``SMALL_MESSAGE_BYTES`` (nearly
  all of them) is not forwarded copy by copy: simulations/wire/flood.py computes every node's
  first arrival at once, over the same mesh and network model, and each node is handed the
  message at that time, in arrival order (one queued step delivers every arrival that comes
  before anything else queued: ``EventLoop.horizon_us``). A change of mesh, liveness or
  partition while a flood is in flight re-plans it before its next event, so the outcome is
  the hop-by-hop one: a node that is down when its copy arrives neither gets nor forwards it.
* **Hop by hop** (:class:`HopByHop`). Bigger frames, which queue on links, and frames that do
  not decode travel copy by copy through ``NetworkModel.flood_hop``.
* Bytes and messages are counted per node, on the sender's up and the receiver's down side,
  duplicates included (and in all, as ``gossip`` bytes and ``gossip_copies`` copies sent): hop by hop as copies go, a planned flood's when it ends or the run
  stops (``flush``).
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

import numpy as np

from protocol.machine import Received
from simulations.node import NodeHost, VirtualNode
from simulations.wire.flood import NEVER, Flood, FloodPlanner, account
from simulations.wire.frames import Frames

#: gossip ids are forgotten this long after publishing (the seen-cache TTL)
SEEN_TTL_US = 120 * 1_000_000


class Publication(NamedTuple):
    """One message a node publishes, framed once for either way of carrying it."""

    node: VirtualNode
    topic: str
    payload: object
    size: int
    #: the peers a publisher not subscribed to ``topic`` sends to (None: its mesh)
    fanout: list[int] | None
    #: the event every node is handed (None with wire bytes: each node decodes its copy)
    event: Received | None


class PlannedFloods:
    """The small gossip messages in flight, each planned whole (see the module docstring)."""

    def __init__(self, host: NodeHost, frames: Frames, seed: int, width: int) -> None:
        self.host = host
        self.frames = frames
        self.planner = FloodPlanner(host.net, seed, width)
        self.floods: list[Flood] = []
        #: the network changed while floods were in flight: re-plan them before the next
        #: flood event (after the change is complete: a crash closes many links at once)
        self.stale = False

    def network_changed(self) -> None:
        """Liveness or partitions changed (mesh changes come through ``mesh_changed``)."""
        if self.floods:
            self.stale = True

    def mesh_changed(self, index: int, topic: str | None = None) -> None:
        """Node ``index``'s mesh on ``topic`` (None: on every topic) changed."""
        self.planner.touch(index, topic)
        self.network_changed()

    def publish(self, pub: Publication) -> None:
        """Plan ``pub``'s flood (to its fanout if the publisher is not subscribed)."""
        if self.stale:
            self._replan()
        host, node = self.host, pub.node
        flood = Flood(pub.topic, node.peer_id, node.index, pub.payload, pub.size, len(host.nodes))
        flood.event = pub.event
        self.planner.plan(flood, host.loop.now_us, host.nodes, pub.fanout)
        self.floods.append(flood)
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
            self.host.loop.at(flood.order_times[0], self._step, flood, flood.generation)
        else:
            self._done(flood)

    def _replan(self) -> None:
        self.stale = False
        host = self.host
        now = host.loop.now_us
        for flood in list(self.floods):
            self.planner.replan(flood, now, host.nodes)
            self._schedule(flood)

    def _step(self, flood: Flood, generation: int) -> None:
        if self.stale:
            self._replan()
        if flood.generation != generation:
            return  # re-planned: a newer step is queued
        loop = self.host.loop
        nodes = self.host.nodes
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
            if self.stale:
                self._replan()  # what it did changed the network: the rest is re-planned
                return
            if flood.generation != generation:
                return
            if pos == len(order):
                self._done(flood)
                return
            at = times[pos]
            if not loop.try_advance(at):
                loop.at(at, self._step, flood, generation)
                return

    def _deliver_frame(self, flood: Flood, target: VirtualNode) -> None:
        """Wire bytes: every receiver decodes its own copy."""
        sender = self.host.nodes[int(flood.parent[target.index])]
        message = self.frames.open(target, sender, flood.payload)
        if message is not None:
            target.deliver_gossip(Received(flood.origin, message, flood.topic))

    def _done(self, flood: Flood) -> None:
        """Every node the flood reaches has it (and has sent its copies on)."""
        self._account(flood)
        self.floods.remove(flood)

    def _account(self, flood: Flood) -> None:
        sent, received, total_sent, total_received, firsts = account(flood)
        if not total_sent and not total_received:
            return
        n = flood.n
        size = flood.size
        traffic = self.host.traffic
        for counter, counts, unit in (
            (traffic.bytes_sent, sent, size),
            (traffic.msgs_sent, sent, 1),
            (traffic.bytes_received, received, size),
            (traffic.msgs_received, received, 1),
        ):
            view = np.frombuffer(counter, dtype=np.int64)
            view[:n] += counts * unit
            del view  # an exported buffer would stop the array from growing
        metrics = self.host.metrics
        if total_sent:
            metrics.add_bytes("gossip", total_sent * size)
            metrics.count("gossip_copies", total_sent)
        if total_received > firsts:
            metrics.count("gossip_duplicates", total_received - firsts)

    def flush(self) -> None:
        """Count the traffic of floods still in flight, for the nodes that have them so far."""
        for flood in self.floods:
            self._account(flood)


# Per published message (a ``_Gossip``), ``arrival[i]`` is 0 (nothing on its way to node i),
# the earliest scheduled arrival time + 1, or -1 once node i has seen the message. A copy
# that would arrive after one already on its way is a duplicate for sure: its bytes are
# counted at once and no event is scheduled for it (most copies in a mesh are such
# duplicates).


class HopByHop:
    """Gossip forwarded copy by copy: big frames and frames that do not decode."""

    def __init__(self, host: NodeHost, frames: Frames) -> None:
        self.host = host
        self.frames = frames
        #: gossip id -> the message in flight, until the seen-cache forgets it
        self._seen: dict[int, _Gossip] = {}
        self._next_gossip_id = 0

    def publish(self, pub: Publication) -> None:
        """Send ``pub`` to the publisher's mesh (to its fanout if it is not subscribed)."""
        host, node = self.host, pub.node
        gid = self._next_gossip_id
        self._next_gossip_id += 1
        gossip = _Gossip(pub.topic, node.peer_id, pub.payload, pub.size, len(host.nodes))
        gossip.event = pub.event
        gossip.arrival[node.index] = -1
        self._seen[gid] = gossip
        host.loop.after(SEEN_TTL_US, self._forget, gid)
        fanout = pub.fanout
        self._forward(node, -1, gossip, node.mesh.get(pub.topic) if fanout is None else fanout)

    def _forward(
        self, node: VirtualNode, came_from: int, gossip: _Gossip, mesh: list[int] | None
    ) -> None:
        if not mesh:
            return
        host = self.host
        nodes = host.nodes
        arrival = gossip.arrival
        if len(arrival) < len(nodes):  # nodes added since: they never see it (as seen)
            arrival.extend([-1] * (len(nodes) - len(arrival)))
        size = gossip.size
        src = node.index
        loop = host.loop
        traffic = host.traffic
        first, duplicates = host.net.flood_hop(
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
            arrive = self._arrive
            for index, at in first:
                target = nodes[index]
                schedule(at, arrive, target, target.epoch, src, gossip)
        sent = len(mesh) - 1 if came_from in mesh else len(mesh)
        if sent:
            traffic.bytes_sent[src] += size * sent
            traffic.msgs_sent[src] += sent
            host.metrics.add_bytes("gossip", size * sent)
            host.metrics.count("gossip_copies", sent)
        if duplicates:
            host.metrics.count("gossip_duplicates", duplicates)

    def _forget(self, gid: int) -> None:
        gossip = self._seen.pop(gid, None)
        if gossip is not None:
            gossip.forgotten = True

    def _arrive(self, target: VirtualNode, epoch: int, src: int, gossip: _Gossip) -> None:
        if target.epoch != epoch or not target.up:
            return
        index = target.index
        host = self.host
        traffic = host.traffic
        traffic.bytes_received[index] += gossip.size
        traffic.msgs_received[index] += 1
        arrival = gossip.arrival
        if gossip.forgotten or arrival[index] != host.loop.now_us + 1:
            host.metrics.count("gossip_duplicates")
            return
        arrival[index] = -1
        event = gossip.event
        if event is None:
            message = self.frames.open(target, host.nodes[src], gossip.payload)
            if message is None:
                return
            event = Received(gossip.origin, message, gossip.topic)
        self._forward(target, src, gossip, target.mesh.get(gossip.topic))
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
