"""Membership: how fast a joining node finds its peers, whether the overlay stays in one piece
under churn, and what discovery costs each node, at up to 10,000 nodes.

Every node runs the real ``Membership`` machine (protocol/membership/machine.py) with the
daemon's timings (Hello, ping every 5 s, peer exchange every 10 s, backoff) and
``target_peers`` connections to keep; nothing connects nodes but the machines' own dials.
``bootstrap_nodes`` seed nodes start first and know each other. The other nodes join at
uniform random times during ``join_s``, each configured with ``bootstrap_per_node`` seed
nodes drawn from the run seed (the daemon's ``bootstrap`` key). After ``settle_s`` without
churn, nodes crash (and restart after ``restart_after_s``), leave and join at the
``[churn]`` rates for ``churn_s``; seed nodes never churn. Every (re)started node is
configured with its seed nodes again: the machine keeps no state across a restart.

Measured:
* *join time*: from a node's start to the moment it holds ``target_peers`` ready (Hello
  exchanged) connections, for the nodes of the join phase and for those (re)started by churn;
* the overlay (the graph of open connections among live nodes): connected components and the
  largest component's share of live nodes, sampled every ``sample_s``; degrees at the end of
  the settle phase;
* traffic per live node per minute, by phase: dials, failed dials, and bytes sent of peer
  exchange (``PeerListRequest``/``PeerList``), keep-alive (``Ping``/``Pong``) and ``Hello``
  (each byte sent is received once).

``[workload]``: ``bootstrap_nodes`` (16), ``bootstrap_per_node`` (2), ``target_peers`` (8),
``join_s`` (60), ``settle_s`` (60), ``churn_s`` (120), ``sample_s`` (10). ``[churn]`` as
everywhere. ``nodes`` is the swarm's size at the start (``--nodes`` overrides it).
"""

from __future__ import annotations

from typing import Any

from protocol.membership.machine import MembershipConfig
from protocol.membership.peers import ConnState
from simulations.machines.membership import bootstrap, membership_of, membership_spec
from simulations.metrics import percentile
from simulations.node import VirtualNode
from simulations.runner.report import Plot, Report, Series
from simulations.runner.world import Churn, build_swarm
from simulations.scenario import Scenario, ScenarioError, workload_value
from simulations.swarm import Swarm, derive_rng
from simulations.workloads.common import Progress, Stages

QUESTION = (
    "How long does a joining node take to reach its target peer count, does the overlay stay "
    "one connected component as nodes join, leave and crash, and how many dials and "
    "peer-exchange bytes does each node pay per minute, at up to 10,000 nodes?"
)
NETWORK_ID = "sim"
AGENT_VERSION = "symphony-sim"
#: message kinds (as counted in ``Metrics.bytes_by_kind``) by what they are for
TRAFFIC_KINDS = {
    "exchange": ("PeerListRequest", "PeerList"),
    "keepalive": ("Ping", "Pong"),
    "hello": ("Hello",),
}
PHASES = ("join", "settle", "churn")


class MembershipRun:
    """One swarm of membership machines, its phases and its measurements."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.seed = scenario.seed
        self.seeds = int(workload_value(scenario, "bootstrap_nodes", 16))
        self.per_node = int(workload_value(scenario, "bootstrap_per_node", 2))
        self.target = int(workload_value(scenario, "target_peers", 8))
        if not 1 <= self.per_node <= self.seeds < scenario.nodes:
            raise ScenarioError(
                f"{scenario.name} [workload]: need 1 <= bootstrap_per_node <= bootstrap_nodes "
                f"< nodes, got {self.per_node}, {self.seeds}, {scenario.nodes}"
            )
        self.join_ms = int(workload_value(scenario, "join_s", 60.0) * 1000)
        self.settle_end_ms = self.join_ms + int(workload_value(scenario, "settle_s", 60.0) * 1000)
        self.end_ms = self.settle_end_ms + int(workload_value(scenario, "churn_s", 120.0) * 1000)
        self.sample_ms = int(workload_value(scenario, "sample_s", 10.0) * 1000)
        config = MembershipConfig(
            network_id=NETWORK_ID, agent_version=AGENT_VERSION, target_peers=self.target
        )
        spec = membership_spec(config)
        self.swarm: Swarm = build_swarm(
            scenario, scenario.nodes, self.seed, lambda i: (spec,), connect=False, start=False
        )
        self._specs = (spec,)
        #: made when the settle phase ends (its rates are per live node at that moment)
        self.churn: Churn | None = None
        #: (node index, incarnation) -> (phase it started in, virtual ms it started)
        self._joining: dict[tuple[int, int], tuple[str, int]] = {}
        #: phase -> ms each node of that phase took to reach the target (None: never did)
        self.join_ms_by_phase: dict[str, list[int]] = {"join": [], "churn": []}
        #: (virtual s, components, largest component's share of live nodes, live nodes)
        self.overlay: list[tuple[float, int, float, int]] = []
        #: phase -> (dials, failed dials, bytes by kind) counted during it; live nodes at its end
        self.traffic: dict[str, tuple[int, int, dict[str, int], int]] = {}
        self.degrees: list[int] = []
        self.swarm.on_emit("peer_ready", self._peer_ready)

    # ------------------------------------------------------------------ joining

    def _bootstraps_of(self, index: int) -> list[VirtualNode]:
        nodes = self.swarm.nodes
        if index < self.seeds:
            return [nodes[i] for i in range(self.seeds) if i != index]
        pick = derive_rng(self.seed, f"bootstrap/{index}").sample(range(self.seeds), self.per_node)
        return [nodes[i] for i in pick]

    def _find_peers(self, node: VirtualNode, phase: str) -> None:
        """(Re)started: configure its seed nodes; its machine does the rest."""
        if node.index >= self.seeds:
            self._joining[(node.index, node.epoch)] = (phase, self.swarm.now_ms)
        bootstrap(node, self._bootstraps_of(node.index))

    def _join(self, node: VirtualNode) -> None:
        self.swarm.start(node)
        self._find_peers(node, "join")

    def _peer_ready(self, node: VirtualNode, fields: dict[str, Any], now_ms: int) -> None:
        key = (node.index, node.epoch)
        started = self._joining.get(key)
        if started is None:
            return
        conns = membership_of(node).conns.values()
        if sum(1 for c in conns if c.state is ConnState.READY) >= self.target:
            del self._joining[key]
            self.join_ms_by_phase[started[0]].append(now_ms - started[1])

    def schedule(self) -> None:
        """Seed nodes now, every other node at a random instant of the join phase; samples,
        phase boundaries."""
        swarm = self.swarm
        for node in swarm.nodes[: self.seeds]:
            swarm.start(node)
        for node in swarm.nodes[: self.seeds]:
            self._find_peers(node, "join")
        when = derive_rng(self.seed, "join-times")
        for node in swarm.nodes[self.seeds :]:
            swarm.at_ms(1 + int(when.random() * self.join_ms), self._join, node)
        for t in range(self.sample_ms, self.end_ms + 1, self.sample_ms):
            swarm.at_ms(t, self._sample)
        swarm.at_ms(self.settle_end_ms, self._measure_degrees)
        swarm.at_ms(self.settle_end_ms, self._start_churn)
        for phase, end in zip(PHASES, (self.join_ms, self.settle_end_ms, self.end_ms), strict=True):
            swarm.at_ms(end, self._close_phase, phase)

    def _start_churn(self) -> None:
        self.churn = Churn(
            self.swarm,
            self.scenario,
            lambda i: self._specs,
            protected=frozenset(range(self.seeds)),
            start_ms=self.settle_end_ms,
            end_ms=self.end_ms,
            on_start=lambda node: self._find_peers(node, "churn"),
        )

    # ------------------------------------------------------------------ measuring

    def _sample(self) -> None:
        sizes = component_sizes(self.swarm)
        live = sum(sizes)
        share = sizes[0] / live if live else 0.0
        self.overlay.append((self.swarm.now_ms / 1000.0, len(sizes), share, live))

    def _measure_degrees(self) -> None:
        self.degrees = sorted(len(n.connections) for n in self.swarm.nodes if n.up)

    def _close_phase(self, phase: str) -> None:
        metrics = self.swarm.metrics
        counters = metrics.counters
        live = sum(1 for n in self.swarm.nodes if n.up)
        self.traffic[phase] = (
            counters.get("dials", 0),
            counters.get("dial_failed", 0),
            dict(metrics.bytes_by_kind),
            live,
        )

    def never_reached(self, phase: str) -> int:
        """Nodes of ``phase`` still up in the incarnation that never reached the target."""
        nodes = self.swarm.nodes
        return sum(
            1
            for (index, epoch), (started_in, _) in self._joining.items()
            if started_in == phase and nodes[index].up and nodes[index].epoch == epoch
        )


def component_sizes(swarm: Swarm) -> list[int]:
    """Sizes of the connected components of the overlay among live nodes, largest first."""
    nodes = swarm.nodes
    seen = bytearray(len(nodes))
    sizes = []
    for node in nodes:
        if not node.up or seen[node.index]:
            continue
        seen[node.index] = 1
        stack = [node.index]
        size = 0
        while stack:
            index = stack.pop()
            size += 1
            for other in nodes[index].connections:
                if not seen[other] and nodes[other].up:
                    seen[other] = 1
                    stack.append(other)
        sizes.append(size)
    return sorted(sizes, reverse=True)


# ---------------------------------------------------------------------- the report


def _phase_traffic(run: MembershipRun) -> list[dict[str, Any]]:
    rows = []
    before: tuple[int, int, dict[str, int], int] = (0, 0, {}, 0)
    start_ms = 0
    for phase, end_ms in zip(PHASES, (run.join_ms, run.settle_end_ms, run.end_ms), strict=True):
        after = run.traffic[phase]
        minutes = max(1, end_ms - start_ms) / 60_000
        per = 1.0 / max(1, after[3]) / minutes
        row: dict[str, Any] = {
            "phase": phase,
            "live_nodes_at_end": after[3],
            "dials_per_node_per_min": (after[0] - before[0]) * per,
            "failed_dials_per_node_per_min": (after[1] - before[1]) * per,
        }
        for name, kinds in TRAFFIC_KINDS.items():
            sent = sum(after[2].get(k, 0) - before[2].get(k, 0) for k in kinds)
            row[f"{name}_bytes_per_node_per_min"] = sent * per
        rows.append(row)
        before, start_ms = after, end_ms
    return rows


def _join_times(run: MembershipRun) -> list[dict[str, Any]]:
    rows = []
    for phase, times in run.join_ms_by_phase.items():
        got = sorted(float(t) for t in times)
        rows.append(
            {
                "phase": phase,
                "reached_target": len(got),
                "never_reached": run.never_reached(phase),
                "p50_s": percentile(got, 0.5) / 1000 if got else -1.0,
                "p90_s": percentile(got, 0.9) / 1000 if got else -1.0,
                "p99_s": percentile(got, 0.99) / 1000 if got else -1.0,
                "max_s": got[-1] / 1000 if got else -1.0,
            }
        )
    return rows


def _overlay_by_phase(run: MembershipRun) -> dict[str, Any]:
    settle_s = run.settle_end_ms / 1000
    at_settle = [o for o in run.overlay if o[0] <= settle_s]
    churn = [o for o in run.overlay if o[0] > settle_s]
    degrees = [float(d) for d in run.degrees]
    return {
        "components_at_end_of_settle": at_settle[-1][1] if at_settle else -1,
        "components_max_under_churn": max((o[1] for o in churn), default=-1),
        "largest_component_share_min_under_churn": min((o[2] for o in churn), default=-1.0),
        "degree_min": degrees[0] if degrees else -1.0,
        "degree_median": percentile(degrees, 0.5) if degrees else -1.0,
        "degree_p99": percentile(degrees, 0.99) if degrees else -1.0,
        "degree_max": degrees[-1] if degrees else -1.0,
        "degree_mean": sum(degrees) / len(degrees) if degrees else -1.0,
    }


def _plots(run: MembershipRun, traffic: list[dict[str, Any]]) -> list[Plot]:
    cdf = []
    for phase, times in run.join_ms_by_phase.items():
        got = sorted(times)
        if got:
            ys = [(i + 1) / len(got) for i in range(len(got))]
            cdf.append(Series(f"{phase} ({len(got)} nodes)", [t / 1000 for t in got], ys))
    ts = [o[0] for o in run.overlay]
    phases = [r["phase"] for r in traffic]
    return [
        Plot("join_time_cdf", f"Time to reach {run.target} ready peers", "seconds after start",
             "fraction of nodes", series=cdf),
        Plot("overlay_components", "Connected components of the overlay (live nodes)",
             "virtual seconds", "count / share", series=[
                 Series("components", ts, [float(o[1]) for o in run.overlay]),
                 Series("largest component's share", ts, [o[2] for o in run.overlay]),
             ]),
        Plot("traffic_by_phase", "Discovery traffic per live node", "phase", "per minute",
             kind="bar", series=[
                 Series("dials", phases, [r["dials_per_node_per_min"] for r in traffic]),
                 Series("peer-exchange kB", phases,
                        [r["exchange_bytes_per_node_per_min"] / 1000 for r in traffic]),
             ]),
    ]  # fmt: skip


def run(scenario: Scenario, progress: Progress) -> Report:
    world = MembershipRun(scenario)
    world.schedule()
    stages = Stages(progress, [1.0])
    stages.run(world.swarm, world.end_ms, f"membership N={scenario.nodes}")
    joins = _join_times(world)
    traffic = _phase_traffic(world)
    overlay = _overlay_by_phase(world)
    initial = joins[0]
    headline = {
        "largest_n": scenario.nodes,
        "join_p50_s": initial["p50_s"],
        "join_p99_s": initial["p99_s"],
        "join_max_s": initial["max_s"],
        "components_at_end_of_settle": overlay["components_at_end_of_settle"],
        "components_max_under_churn": overlay["components_max_under_churn"],
        "degree_max": overlay["degree_max"],
        "dials_per_node_per_min_under_churn": traffic[2]["dials_per_node_per_min"],
        "exchange_bytes_per_node_per_min_under_churn": traffic[2]["exchange_bytes_per_node_per_min"],
    }
    invariants = {
        "every_joined_node_reached_its_target": initial["never_reached"] == 0,
        "one_component_without_churn": overlay["components_at_end_of_settle"] == 1,
    }
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=headline,
        results={
            "join_times": joins,
            "overlay": overlay,
            "traffic_by_phase": traffic,
            "churn": world.churn.summary() if world.churn is not None else {},
            "events": world.swarm.loop.events_run,
        },
        plots=_plots(world, traffic),
        invariants=invariants,
        notes=[
            f"{world.seeds} seed nodes; each other node is configured with {world.per_node} of "
            "them. Inbound connections are never refused, so seed nodes gather many.",
            "Join time counts ready connections (Hello exchanged), inbound ones included.",
        ],
    )
