"""The swarm: N virtual nodes on one virtual clock, a network model and a simulated transport.

Contract
--------
* ``Swarm(seed, ...)`` derives every random stream from ``seed``: the network's, each node's
  (``node.rng``, handed to its machines) and each node's Ed25519 identity, so the same seed
  gives the same peer ids, the same draws in the same order, the same run.
* ``add_node`` creates a node (identity, bandwidth, region, machines); ``start`` boots it.
  ``perform`` is the one place effects are carried out: the common effects of
  protocol/machine.py here and in the transport, machine-specific ones by the performer the
  machine's :class:`~simulations.node.MachineSpec` registered (no performer is an error).
* ``Emit`` effects are counted as ``emit.<event>`` and handed to listeners registered with
  ``on_emit``: that is how workloads observe protocol outcomes without reaching inside.
* Churn: ``crash`` (silent; neighbours notice after ``crash_detect_ms``), ``leave``
  (graceful), ``restart`` (machines rebuilt from the node's ``store``, connections redone by
  the caller or the membership machine). Partitions start and heal on the clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from crypto.hashing import digest
from crypto.keys import Identity
from protocol.errors import LocalProtocolError
from protocol.machine import Dial, Disconnect, Emit, Penalize, Publish, Send
from simulations.engine import US_PER_MS, EventLoop
from simulations.memo import SharedResults
from simulations.metrics import Metrics, Traffic
from simulations.network import LatencyModel, LinkFaults, NetworkModel
from simulations.node import MachineSlot, MachineSpec, VirtualNode
from simulations.runner.live import LiveNodes
from simulations.transport import SimTransport

#: 2024-01-01T00:00:00Z: where virtual time starts on the machines' clocks
DEFAULT_EPOCH_MS = 1_704_067_200_000

EmitListener = Callable[[VirtualNode, dict[str, Any], int], None]


def derive_seed(seed: int, label: str) -> bytes:
    """32 bytes derived from the run seed and a label (identity seeds, sub-streams)."""
    return digest(f"{seed}/{label}".encode(), person=b"symphony-sim")


def derive_rng(seed: int, label: str) -> random.Random:
    return random.Random(int.from_bytes(derive_seed(seed, label)[:8], "big"))


class Swarm:
    def __init__(
        self,
        seed: int,
        *,
        latency: LatencyModel | None = None,
        faults: LinkFaults | None = None,
        wire_bytes: bool = False,
        degree: int = 6,
        send_timeout_ms: int = 10_000,
        crash_detect_ms: int = 5_000,
        epoch_ms: int = DEFAULT_EPOCH_MS,
    ) -> None:
        self.seed = seed
        #: machines see virtual time plus this (Unix-epoch ms: records carry wall-clock times)
        self.epoch_ms = epoch_ms
        self.loop = EventLoop()
        self.rng = derive_rng(seed, "swarm")
        self.net = NetworkModel(
            derive_rng(seed, "network"),
            latency=latency or LatencyModel(),
            faults=faults or LinkFaults(),
        )
        self.metrics = Metrics()
        self.traffic = Traffic()
        #: pure-function results shared by this swarm's machines (simulations/memo.py)
        self.memo = SharedResults()
        self.transport = SimTransport(
            self,
            wire_bytes=wire_bytes,
            degree=degree,
            degree_high=2 * degree,
            send_timeout_ms=send_timeout_ms,
            crash_detect_ms=crash_detect_ms,
            flood_seed=int.from_bytes(derive_seed(seed, "gossip")[:8], "big"),
        )
        self.nodes: list[VirtualNode] = []
        #: which nodes are up (kept by ``start`` and ``_stop``, the only places that flip it)
        self.live = LiveNodes()
        self._by_peer: dict[str, VirtualNode] = {}
        self._listeners: dict[str, list[EmitListener]] = {}
        #: the common effects of protocol/machine.py, by exact type
        self._common: dict[type, Callable[[VirtualNode, MachineSlot, Any], None]] = {
            Send: self._send,
            Publish: self._publish,
            Emit: self._emit,
            Dial: self._dial,
            Disconnect: self._disconnect,
            Penalize: self._penalize,
        }

    # ------------------------------------------------------------------ nodes

    def add_node(
        self,
        specs: tuple[MachineSpec, ...],
        *,
        up_bps: float = 12_500_000.0,
        down_bps: float = 12_500_000.0,
        region: int = 0,
        profile: Any = None,
    ) -> VirtualNode:
        index = len(self.nodes)
        identity = Identity.from_seed(derive_seed(self.seed, f"node/{index}"))
        rng = derive_rng(self.seed, f"node-rng/{index}")
        node = VirtualNode(self, index, identity, rng, specs, profile)
        self.net.add_node(up_bps, down_bps, region)
        self.traffic.add_node()
        self.nodes.append(node)
        self.live.add()
        self._by_peer[node.peer_id] = node
        return node

    def node_of(self, peer: str) -> VirtualNode | None:
        return self._by_peer.get(peer)

    def start(self, node: VirtualNode) -> None:
        if node.up:
            return
        self.net.reset_node(node.index, self.loop.now_us)
        node.boot()
        self.live.set(node.index, node.up)
        self.transport.node_up(node)
        self.metrics.count("node_started")

    def crash(self, node: VirtualNode) -> None:
        self._stop(node, graceful=False, counter="node_crashed")

    def leave(self, node: VirtualNode) -> None:
        self._stop(node, graceful=True, counter="node_left")

    def _stop(self, node: VirtualNode, *, graceful: bool, counter: str) -> None:
        if not node.up:
            return
        self.transport.node_down(node, graceful=graceful)
        node.halt()
        self.live.set(node.index, False)
        self.metrics.count(counter)

    def restart(self, node: VirtualNode) -> None:
        self.crash(node)
        self.start(node)

    # ------------------------------------------------------------------ topology helpers

    def connect(self, a: VirtualNode, b: VirtualNode) -> None:
        self.transport.connect_now(a, b)

    def connect_random(self, node: VirtualNode, count: int, rng: random.Random) -> None:
        """Connect ``node`` at once to ``count`` random live nodes it is not yet connected to."""
        nodes = self.nodes
        made = 0
        for _ in range(4 * count):  # rejection sampling: O(count), not O(N), per node
            if made >= count:
                return
            other = nodes[rng.randrange(len(nodes))]
            if other is node or not other.up or other.index in node.connections:
                continue
            self.transport.connect_now(node, other)
            made += 1
        live = [n for n in nodes if n.up and n is not node and n.index not in node.connections]
        for other in rng.sample(live, min(count - made, len(live))):
            self.transport.connect_now(node, other)

    def partition(self, groups: list[list[int]], start_ms: int, heal_ms: int) -> None:
        self.loop.at(start_ms * US_PER_MS, self._partition_start, groups)
        self.loop.at(heal_ms * US_PER_MS, self._partition_heal)

    def _partition_start(self, groups: list[list[int]]) -> None:
        self.net.apply_partition(groups)
        self.transport.network_changed()
        self.metrics.count("partition_started")

    def _partition_heal(self) -> None:
        self.net.heal()
        self.transport.network_changed()
        self.metrics.count("partition_healed")

    # ------------------------------------------------------------------ effects

    def on_emit(self, event: str, listener: EmitListener) -> None:
        self._listeners.setdefault(event, []).append(listener)

    def perform(self, node: VirtualNode, slot: MachineSlot, effect: object) -> None:
        kind = type(effect)
        performer = slot.spec.performers.get(kind)
        if performer is not None:
            performer(node, slot.spec.name, effect)
            return
        common = self._common.get(kind)
        if common is None:
            raise LocalProtocolError(
                f"machine {slot.spec.name!r} returned {kind.__name__}, which no performer takes"
            )
        common(node, slot, effect)

    def _send(self, node: VirtualNode, slot: MachineSlot, effect: Send) -> None:
        self.transport.send(node, slot, effect.peer, effect.message)

    def _publish(self, node: VirtualNode, slot: MachineSlot, effect: Publish) -> None:
        self.transport.publish(node, effect.topic, effect.message)

    def _emit(self, node: VirtualNode, slot: MachineSlot, effect: Emit) -> None:
        self.metrics.count("emit." + effect.event)
        listeners = self._listeners.get(effect.event)
        if listeners:
            fields = dict(effect.fields)
            now_ms = self.loop.now_us // US_PER_MS
            for listener in listeners:
                listener(node, fields, now_ms)

    def _dial(self, node: VirtualNode, slot: MachineSlot, effect: Dial) -> None:
        self.transport.dial(node, effect.peer)

    def _disconnect(self, node: VirtualNode, slot: MachineSlot, effect: Disconnect) -> None:
        self.transport.disconnect(node, effect.peer, effect.reason)

    def _penalize(self, node: VirtualNode, slot: MachineSlot, effect: Penalize) -> None:
        node.penalize(effect.peer, effect.reason, effect.points)

    # ------------------------------------------------------------------ running

    @property
    def now_ms(self) -> int:
        """Virtual milliseconds since the start of the run."""
        return self.loop.now_us // US_PER_MS

    @property
    def machine_now_ms(self) -> int:
        """The time machines see now (Unix-epoch milliseconds)."""
        return self.loop.now_us // US_PER_MS + self.epoch_ms

    def at_ms(self, time_ms: int, callback: Callable[..., None], *args: Any) -> None:
        self.loop.at(time_ms * US_PER_MS, callback, *args)

    def run(self, until_ms: int, on_progress: Callable[[int], None] | None = None) -> int:
        ran = self.loop.run(until_ms * US_PER_MS, on_progress=on_progress)
        self.transport.flush_traffic()
        return ran

    def bytes_per_node(self) -> list[int]:
        self.transport.flush_traffic()
        t = self.traffic
        return [a + b for a, b in zip(t.bytes_sent, t.bytes_received, strict=True)]
