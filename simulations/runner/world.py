"""Building a swarm from a scenario: nodes with bandwidth classes, a random topology,
partitions on the clock, and a churn process (crash/restart, leave, join).

Contract: everything drawn here comes from streams derived from the run seed, so a scenario
and a seed give the same nodes, links and churn events every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from simulations.node import MachineSpec, VirtualNode
from simulations.runner.live import EligibleNodes
from simulations.scenario import Scenario
from simulations.swarm import Swarm, derive_rng

SpecsOf = Callable[[int], tuple[MachineSpec, ...]]
ProfileOf = Callable[[int], Any]
#: what a node that (re)started does to find peers
OnStart = Callable[[VirtualNode], None]


def build_swarm(
    scenario: Scenario,
    nodes: int,
    seed: int,
    specs_of: SpecsOf,
    profile_of: ProfileOf | None = None,
    *,
    connect: bool = True,
    start: bool = True,
) -> Swarm:
    """A swarm of ``nodes`` nodes for ``scenario``: started (unless ``start`` is false: the
    workload starts them) and connected at random (``connect``, started nodes only)."""
    net = scenario.network
    swarm = Swarm(
        seed,
        latency=net.latency,
        faults=net.faults,
        wire_bytes=scenario.wire_bytes,
        degree=min(6, max(1, net.degree)),
    )
    rng = derive_rng(seed, "world")
    for _ in range(nodes):
        add_node(swarm, scenario, specs_of, profile_of, rng.random())
    if start:
        for node in swarm.nodes:
            swarm.start(node)
    if connect and start:
        topo = derive_rng(seed, "topology")
        half = max(1, net.degree // 2)
        for node in swarm.nodes:
            swarm.connect_random(node, half, topo)
    for part in net.partitions:
        groups: list[list[int]] = []
        first = 0
        for share in part.groups:
            end = min(nodes, first + round(share * nodes))
            groups.append(list(range(first, end)))
            first = end
        swarm.partition(groups, int(part.start_s * 1000), int(part.heal_s * 1000))
    return swarm


def add_node(
    swarm: Swarm,
    scenario: Scenario,
    specs_of: SpecsOf,
    profile_of: ProfileOf | None,
    draw: float,
) -> VirtualNode:
    index = len(swarm.nodes)
    bands = scenario.network.bandwidth
    acc = 0.0
    band = bands[-1]
    for b in bands:
        acc += b.share
        if draw < acc:
            band = b
            break
    regions = len(scenario.network.latency.region_names)
    return swarm.add_node(
        specs_of(index),
        up_bps=band.up_bps,
        down_bps=band.down_bps,
        region=index % regions if regions else 0,
        profile=profile_of(index) if profile_of is not None else None,
    )


class Churn:
    """Poisson crash/leave/join events at the scenario's per-minute rates.

    A restarted or joining node connects to ``network.degree`` random live nodes at once, or,
    given ``on_start``, finds its peers itself (``on_start(node)``: e.g. through its
    membership machine's bootstrap peers)."""

    def __init__(
        self,
        swarm: Swarm,
        scenario: Scenario,
        specs_of: SpecsOf,
        profile_of: ProfileOf | None = None,
        *,
        protected: frozenset[int] = frozenset(),
        start_ms: int = 0,
        end_ms: int | None = None,
        on_start: OnStart | None = None,
    ) -> None:
        self.swarm = swarm
        self.on_start = on_start
        self.scenario = scenario
        self.spec = scenario.churn
        self.specs_of = specs_of
        self.profile_of = profile_of
        self.protected = protected
        self.end_ms = end_ms
        self.rng = derive_rng(swarm.seed, "churn")
        self.crashes = 0
        self.leaves = 0
        self.joins = 0
        self.restarts = 0
        for kind, rate in (
            ("crash", self.spec.crash_per_min),
            ("leave", self.spec.leave_per_min),
            ("join", self.spec.join_per_min),
        ):
            if rate > 0:
                self._schedule(kind, start_ms)

    def _rate_per_ms(self, kind: str) -> float:
        live = self.swarm.live.count
        per_min = {
            "crash": self.spec.crash_per_min,
            "leave": self.spec.leave_per_min,
            "join": self.spec.join_per_min,
        }[kind]
        return per_min * max(1, live) / 60_000.0

    def _schedule(self, kind: str, now_ms: int) -> None:
        rate = self._rate_per_ms(kind)
        gap = -math.log(1.0 - self.rng.random()) / rate
        at = now_ms + max(1, int(gap))
        if self.end_ms is None or at < self.end_ms:
            self.swarm.at_ms(at, self._fire, kind)

    def _victim(self) -> VirtualNode | None:
        # the live unprotected nodes in index order, without listing them (O(log N) a pick)
        live = EligibleNodes(self.swarm.live, self.protected)
        return self.swarm.nodes[self.rng.choice(live)] if len(live) else None

    def _fire(self, kind: str) -> None:
        swarm = self.swarm
        if kind == "crash":
            node = self._victim()
            if node is not None:
                swarm.crash(node)
                self.crashes += 1
                swarm.at_ms(
                    swarm.now_ms + int(self.spec.restart_after_s * 1000), self._restart, node
                )
        elif kind == "leave":
            node = self._victim()
            if node is not None:
                swarm.leave(node)
                self.leaves += 1
        else:
            node = add_node(swarm, self.scenario, self.specs_of, self.profile_of, self.rng.random())
            swarm.start(node)
            self._find_peers(node)
            self.joins += 1
        self._schedule(kind, swarm.now_ms)

    def _restart(self, node: VirtualNode) -> None:
        if node.up:
            return
        self.swarm.start(node)
        self._find_peers(node)
        self.restarts += 1

    def _find_peers(self, node: VirtualNode) -> None:
        if self.on_start is not None:
            self.on_start(node)
        else:
            self.swarm.connect_random(node, self.scenario.network.degree, self.rng)

    def summary(self) -> dict[str, int]:
        return {
            "crashes": self.crashes,
            "restarts": self.restarts,
            "leaves": self.leaves,
            "joins": self.joins,
        }
