"""Gossip floods planned whole: when each node first gets a small gossip message, and from whom.

A gossip message of up to ``SMALL_MESSAGE_BYTES`` crosses the mesh in a second or so, and its
spread is a shortest-arrival-time problem: node b first gets it at ``min over mesh peers a
(arrival(a) + w(a, b))``, where a copy's time ``w`` is the link's latency, a jitter draw and
the sender's serialization of its copies in mesh order (the copy to the j-th peer leaves
after j + 1 serialization times). :class:`FloodPlanner` solves it at once in numpy over the
topic's mesh (:class:`MeshTable`), instead of one Python event per copy: simulations/wire/gossip.py
then hands the message to each node's machines at its first arrival, in arrival order.

Contract
--------
* A plan reads the mesh, liveness, partitions, loss and duplication as they are when it is
  made. When any of them changes while a flood is in flight gossip.py re-plans it
  (:meth:`FloodPlanner.replan`): the nodes that already have the message keep their arrival
  times and the copies they sent (copies on their way to a node that went down or restarted
  since are lost); every other node forwards with the mesh of now. So a node that crashes
  mid-flood forwards nothing, and one that joins a mesh mid-flood can still be reached.
* Jitter, loss and duplication are drawn from the planner's own seeded generator, in the
  order floods are planned: a run stays reproducible from its seed.
* Small frames do not queue behind other traffic on a link (as ``NetworkModel.transfer``
  lets them through), so a plan neither reads nor moves the links' queues.
* Traffic (bytes and messages per node, duplicates included, not the copy back to the node
  it came from) is counted by :func:`account` for the nodes that have the message, when the
  flood ends or the run stops.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from simulations.engine import US_PER_S

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from simulations.network import NetworkModel

#: "never": an unreached node's arrival, a lost copy's weight (two of them do not overflow)
NEVER = 1 << 62


class MeshMember(Protocol):
    """What a plan reads of a node: its gossip mesh, topic -> mesh peers' indices in mesh
    order (simulations/node.py's ``VirtualNode`` is one)."""

    @property
    def mesh(self) -> dict[str, list[int]]: ...


class MeshTable:
    """One topic's mesh as arrays: row i holds node i's mesh peers in mesh order (-1 after)
    and the base latency of each link; rows are rewritten when the transport marks them."""

    __slots__ = ("topic", "width", "peers", "latency", "dirty")

    def __init__(self, topic: str, width: int) -> None:
        self.topic = topic
        self.width = width
        self.peers: NDArray[np.int32] = np.full((0, width), -1, dtype=np.int32)
        self.latency: NDArray[np.int64] = np.zeros((0, width), dtype=np.int64)
        self.dirty: set[int] = set()

    def refresh(self, nodes: Sequence[MeshMember], net: NetworkModel) -> None:
        n = len(nodes)
        if n > len(self.peers):
            grow = n - len(self.peers)
            self.peers = np.vstack([self.peers, np.full((grow, self.width), -1, np.int32)])
            self.latency = np.vstack([self.latency, np.zeros((grow, self.width), np.int64)])
            self.dirty.update(range(n - grow, n))
        if not self.dirty:
            return
        topic = self.topic
        peers = self.peers
        latency = self.latency
        base = net.base_latency_us
        for i in sorted(self.dirty):
            mesh = nodes[i].mesh.get(topic, ())
            if len(mesh) > self.width:
                raise ValueError(f"node {i}'s mesh on {topic!r} is wider than {self.width}")
            row = peers[i]
            row[:] = -1
            row[: len(mesh)] = mesh
            latency[i, : len(mesh)] = [base(i, j) for j in mesh]
        self.dirty.clear()


class Flood:
    """One planned gossip message in flight (see the module docstring)."""

    __slots__ = (
        "topic",
        "origin",
        "source",
        "payload",
        "size",
        "event",
        "n",
        "rows",
        "weights",
        "dups",
        "arrival",
        "parent",
        "delivered",
        "accounted",
        "incarnations",
        "order",
        "order_times",
        "pos",
        "generation",
    )

    def __init__(self, topic: str, origin: str, source: int, payload: object, size: int, n: int):
        self.topic = topic
        self.origin = origin
        self.source = source
        self.payload = payload
        self.size = size
        #: the Received every node is handed (None with wire bytes: each decodes its copy)
        self.event: Any = None
        #: nodes that existed at publish: later ones never see it (as with the seen-cache)
        self.n = n
        #: per node: the peers it sends to, each copy's time (NEVER: not arriving), duplicated
        self.rows: NDArray[np.int32] = np.empty((0, 0), np.int32)
        self.weights: NDArray[np.int64] = np.empty((0, 0), np.int64)
        self.dups: NDArray[np.bool_] | None = None
        self.arrival: NDArray[np.int64] = np.full(n, NEVER, np.int64)
        self.parent: NDArray[np.int32] = np.full(n, -1, np.int32)
        #: has it (set by the transport as each first copy arrives); its traffic counted
        self.delivered = bytearray(n)
        self.accounted: NDArray[np.bool_] = np.zeros(n, np.bool_)
        #: each node's incarnation when the plan was made (-1: down)
        self.incarnations: NDArray[np.int64] = np.zeros(n, np.int64)
        #: the nodes still to get it, by arrival, and their arrival times; the next one's place
        self.order: list[int] = []
        self.order_times: list[int] = []
        self.pos = 0
        #: bumped by every (re-)plan: a step queued for an older plan does nothing
        self.generation = 0

    def have(self) -> NDArray[np.bool_]:
        """Per node: it has the message (its first copy was delivered, or it sent it)."""
        return np.frombuffer(self.delivered, dtype=np.uint8).astype(np.bool_)


class FloodPlanner:
    """Plans and re-plans floods over one swarm's meshes and network model."""

    def __init__(self, net: NetworkModel, seed: int, width: int) -> None:
        self.net = net
        self.width = width
        self.gen = np.random.Generator(np.random.PCG64(seed))
        self.tables: dict[str, MeshTable] = {}
        self._rates_n = -1
        self._incarnation: array[int] = array("q")
        self._up: NDArray[np.float64] = np.empty(0)
        self._down: NDArray[np.float64] = np.empty(0)

    def table(self, topic: str) -> MeshTable:
        table = self.tables.get(topic)
        if table is None:
            table = self.tables[topic] = MeshTable(topic, self.width)
        return table

    def touch(self, index: int, topic: str | None = None) -> None:
        """Node ``index``'s mesh (on ``topic``, or on every topic) changed."""
        if topic is not None:
            self.table(topic).dirty.add(index)
            return
        for table in self.tables.values():
            table.dirty.add(index)

    # ------------------------------------------------------------------ planning

    def plan(
        self,
        flood: Flood,
        now_us: int,
        nodes: Sequence[MeshMember],
        fanout: list[int] | None,
    ) -> None:
        """Plan a new flood sent by ``flood.source`` at ``now_us`` (to ``fanout`` instead of
        its mesh when it is not subscribed)."""
        flood.rows, flood.weights, flood.dups = self._edges(flood, nodes)
        source = flood.source
        if fanout is not None:
            self._fanout(flood, fanout)
        flood.arrival[source] = now_us
        flood.delivered[source] = 1
        flood.incarnations = self._incarnations(flood.n)
        _shortest(flood, np.array([source]))

    def replan(self, flood: Flood, now_us: int, nodes: Sequence[MeshMember]) -> None:
        """Re-plan a flood in flight after the network changed."""
        have = flood.have()
        incarnations = self._incarnations(flood.n)
        rows, weights = flood.rows, flood.weights
        # copies still on their way from nodes that have it, to a node since gone or restarted
        gone = incarnations != flood.incarnations
        sent = have[:, None] & (rows >= 0)
        on_way = sent & (flood.arrival[:, None] + weights >= now_us)
        lost = on_way & gone[np.where(rows >= 0, rows, 0)]
        weights[lost] = NEVER
        new_rows, new_weights, new_dups = self._edges(flood, nodes)
        keep = have[:, None]
        flood.rows = np.where(keep, rows, new_rows)
        flood.weights = np.where(keep, weights, new_weights)
        if flood.dups is not None and new_dups is not None:
            flood.dups = np.where(keep, flood.dups, new_dups)
        flood.incarnations = incarnations
        flood.arrival[~have] = NEVER
        _shortest(flood, np.flatnonzero(have))

    def _edges(
        self, flood: Flood, nodes: Sequence[MeshMember]
    ) -> tuple[NDArray[np.int32], NDArray[np.int64], NDArray[np.bool_] | None]:
        """Every node's copies as it would send them now: peers, times, duplicated."""
        n = flood.n
        table = self.table(flood.topic)
        table.refresh(nodes, self.net)
        rows = table.peers[:n].copy()
        if n < len(table.peers):
            rows[rows >= n] = -1  # nodes added after the publish never see it
        weights, dups = self._times(flood.size, np.arange(n), rows, table.latency[:n])
        return rows, weights, dups

    def _fanout(self, flood: Flood, fanout: list[int]) -> None:
        """A publisher that is not subscribed sends to ``fanout`` instead of a mesh."""
        a = flood.source
        row = np.full((1, self.width), -1, np.int32)
        row[0, : len(fanout)] = fanout
        latency = np.zeros((1, self.width), np.int64)
        latency[0, : len(fanout)] = [self.net.base_latency_us(a, b) for b in fanout]
        weights, dups = self._times(flood.size, np.array([a]), row, latency)
        flood.rows[a] = row[0]
        flood.weights[a] = weights[0]
        if flood.dups is not None and dups is not None:
            flood.dups[a] = dups[0]

    def _times(
        self,
        size: int,
        senders: NDArray[Any],
        rows: NDArray[np.int32],
        latency: NDArray[np.int64],
    ) -> tuple[NDArray[np.int64], NDArray[np.bool_] | None]:
        """Each copy's time from its sender's forward to its end at the receiver (NEVER:
        lost or cut off by a partition), and whether the network duplicates it."""
        net = self.net
        has = rows >= 0
        peer = np.where(has, rows, 0)
        # the uplink serializes a node's copies in mesh order: copy j ends after j + 1 of them
        rank = np.arange(1, rows.shape[1] + 1, dtype=np.int64)
        rate = net.one_rate
        if rate is not None:
            each: Any = int(size * US_PER_S / rate) + 1
        else:
            up, down = self._rates()
            each = (size * US_PER_S / np.minimum(up[senders][:, None], down[peer])).astype(
                np.int64
            ) + 1
        weights = latency + rank * each
        if net.jitter_us:
            weights += (self.gen.random(rows.shape) * net.jitter_us).astype(np.int64)
        ok = has
        if net.is_partitioned():
            group = np.asarray(net.group, np.int64)
            mine = group[senders][:, None]
            ok = ok & (mine >= 0) & (mine == group[peer])
        if net.faults.loss:
            ok = ok & (self.gen.random(rows.shape) >= net.faults.loss)
        dups = None
        if net.faults.duplicate:
            dups = self.gen.random(rows.shape) < net.faults.duplicate
        weights[~ok] = NEVER
        return weights, dups

    def set_incarnation(self, index: int, epoch: int | None) -> None:
        """Node ``index`` is up in incarnation ``epoch``, or down (None): a copy on its way
        to a node whose incarnation changes since it was sent is lost."""
        grow = index + 1 - len(self._incarnation)
        if grow > 0:
            self._incarnation.extend([-1] * grow)
        self._incarnation[index] = -1 if epoch is None else epoch

    def _incarnations(self, n: int) -> NDArray[np.int64]:
        have = np.frombuffer(self._incarnation, dtype=np.int64)[:n]
        out = np.full(n, -1, np.int64)
        out[: len(have)] = have
        return out

    def _rates(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        net = self.net
        if self._rates_n != len(net.up_bps):
            self._up = np.asarray(net.up_bps, np.float64)
            self._down = np.asarray(net.down_bps, np.float64)
            self._rates_n = len(net.up_bps)
        return self._up, self._down


def _shortest(flood: Flood, front: NDArray[Any]) -> None:
    shortest_arrivals(flood.arrival, flood.parent, flood.rows, flood.weights, front)


def shortest_arrivals(arrival: NDArray[np.int64], parent: NDArray[np.int32],
                      rows: NDArray[np.int32], weights: NDArray[np.int64], front: Any) -> None:
    """Fill ``arrival`` (earliest arrivals, from the nodes in ``front`` at their given times)
    and ``parent`` (whose copy arrived first; of several at the same time, the lowest-numbered
    sender's), leaving the arrivals of ``front`` as they are. Node ``a`` sends to
    ``rows[a, j]`` (-1: no one) in ``weights[a, j]`` (``NEVER``: not at all)."""
    _relax(arrival, rows, weights, front)
    _parents(arrival, parent, rows, weights)


def _relax(
    arrival: NDArray[np.int64], rows: NDArray[np.int32], weights: NDArray[np.int64], front: Any
) -> None:
    """Shortest arrivals by rounds (Bellman-Ford), each pushing from the nodes that improved
    in the last: a handful of array operations per round, whatever the swarm's size (a heap
    in Python is faster only below ~70 nodes)."""
    while front.size:
        cand = arrival[front][:, None] + weights[front]
        ok = cand < NEVER
        target = rows[front][ok]
        cand = cand[ok]
        better = cand < arrival[target]
        if not better.any():
            return
        target = target[better]
        np.minimum.at(arrival, target, cand[better])
        mark = np.zeros(len(arrival), np.bool_)  # the nodes that improved, once each
        mark[target] = True
        front = np.flatnonzero(mark)


def _parents(
    arrival: NDArray[np.int64],
    parent: NDArray[np.int32],
    rows: NDArray[np.int32],
    weights: NDArray[np.int64],
) -> None:
    reached = np.flatnonzero(arrival < NEVER)
    cand = arrival[reached][:, None] + weights[reached]
    target = rows[reached]
    first = (cand < NEVER) & (cand == arrival[np.where(target >= 0, target, 0)])
    sender = np.repeat(reached, rows.shape[1]).reshape(target.shape)[first].astype(np.int32)
    parent[:] = np.iinfo(np.int32).max
    np.minimum.at(parent, target[first], sender)
    parent[parent == np.iinfo(np.int32).max] = -1


def account(flood: Flood) -> tuple[NDArray[np.int64], NDArray[np.int64], int, int, int]:
    """The traffic of the nodes that have ``flood`` and were not counted yet: per node
    (messages sent, messages received) over ``flood.n`` nodes, total copies sent, total
    received, and how many of those were first copies."""
    have = flood.have()
    fresh = np.flatnonzero(have & ~flood.accounted)
    n = flood.n
    if not fresh.size:
        zero = np.zeros(n, np.int64)
        return zero, zero.copy(), 0, 0, 0
    flood.accounted[fresh] = True
    rows = flood.rows[fresh]
    sends = (rows >= 0) & (rows != flood.parent[fresh][:, None])
    sent = np.zeros(n, np.int64)
    sent[fresh] = sends.sum(axis=1)
    arrives = sends & (flood.weights[fresh] < NEVER)
    target = rows[arrives]
    received = np.bincount(target, minlength=n).astype(np.int64)
    if flood.dups is not None:
        doubled = arrives & flood.dups[fresh]
        received += np.bincount(rows[doubled], minlength=n)
    sender = np.repeat(fresh, rows.shape[1]).reshape(rows.shape)[arrives]
    firsts = int(np.count_nonzero(flood.parent[target] == sender))
    return sent, received, int(sent.sum()), int(received.sum()), firsts
