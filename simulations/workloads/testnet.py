"""A local testnet of real daemons, simulated: what ``bench scale`` holds against the daemons.

``bench scale`` (node/bench/scale/) starts N light daemons, changes one node's capability
record a few times and measures the network; :func:`predict` runs the same protocol code
(protocol/membership, protocol/ledger) on virtual nodes for the same testnet and workload and
returns the simulator's figures for the same keys. Two runs:

* **membership** (``peers_per_node``): every node runs the real ``Membership`` and
  ``Discovery`` machines (what the daemon's membership and discovery services drive) with
  the daemons' config, starts at the instant its daemon started (``start_ms``) with the
  bootstrap peers its daemon was given (``bootstraps``); the links' one-way latency
  is the median the daemons measured. Prediction: the mean number of ready peers per node
  at ``peers_at_ms``. Nothing about the connections is taken from the daemons.
* **ledger** (``converged_s``, ``gossip_bytes_per_node_min``): the real ``LedgerMachine`` on
  the daemons' own topology (``edges``), each link taking the one-way latency its daemons
  measured (half their ping round trip; the median for a link never measured), each node
  advertising the capability the daemon advertised (``specs``). A node stores a version it
  received after a processing delay of its own (decoding, signature check, store), drawn
  per node and version from those measured on the daemons (``processing_ms``: each node's
  arrival of a version minus its first neighbour's, less their link's latency), and that
  delay holds up no forwarding: the daemon's gossipsub forwards a validated message before
  the ledger sees it (py-libp2p's ``Pubsub.push_msg``), so a busy node is late itself
  without making the nodes behind it late. The gossip meshes are the simulator's (simulations/transport.py:
  gossipsub's degree 6, at most 12). After every record has spread, the same updates as the
  daemons' (``updates``: offset, node, new spec) are made; ``converged_s`` is the median
  over updates of the time from the updater storing its new record to the last node
  storing it, and ``gossip_bytes_per_node_min`` the gossip message bytes every node
  received (duplicates included) per minute over ``window_ms`` from the first update.

  The prediction of ``converged_s`` is its expected value over ``DELAY_DRAWS`` draws of the
  delays, not one draw: since a delay holds up no forwarding, one run gives each node's
  arrival of each version, and every draw adds delays to the same arrivals. The last of a
  hundred nodes is as late as the largest of a hundred draws from a long-tailed spread, which
  one draw put anywhere from 0.9 to 1.9 s for the same measured delays (a 100-daemon capture).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from protocol.ledger.machine import CapabilitySpec, LedgerConfig, SetCapability, StoreCapability
from protocol.membership.discovery import DiscoveryConfig
from protocol.membership.machine import MembershipConfig
from simulations.machines.discovery import discovery_spec
from simulations.machines.ledger import NAME as LEDGER
from simulations.machines.ledger import ledger_spec
from simulations.machines.membership import bootstrap, membership_of, membership_spec
from simulations.network import LatencyModel
from simulations.node import VirtualNode
from simulations.swarm import Swarm
from simulations.wire.frames import FRAME_OVERHEAD

NETWORK_ID = "sim"
#: virtual time the ledger run gives the initial records to spread before the first update
SPREAD_MS = 60_000
#: bandwidth of a simulated loopback link (bytes/s): a message's transfer time is negligible
LOOPBACK_BPS = 1e9
#: draws of the processing delays the prediction of ``converged_s`` averages over (module doc)
DELAY_DRAWS = 200


@dataclass(frozen=True)
class Update:
    """Node ``node`` advertises ``spec`` ``at_ms`` after the first update."""

    at_ms: int
    node: int
    spec: CapabilitySpec


@dataclass(frozen=True)
class DaemonNet:
    """What the daemons were and did, as the simulator's input (see the module docstring)."""

    start_ms: tuple[int, ...]  #: each node's start, from node 0's
    bootstraps: tuple[tuple[int, ...], ...]  #: the nodes each node bootstraps from
    specs: tuple[CapabilitySpec, ...]  #: each node's advertised capability before the updates
    edges: tuple[tuple[int, int], ...]  #: connections (i < j) when the updates began
    #: measured one-way latency (ms) of links, keyed (i, j) with i < j
    latency_ms: dict[tuple[int, int], float]
    updates: tuple[Update, ...]
    window_ms: int  #: the measurement window, from the first update
    peers_at_ms: int  #: when (from node 0's start) the daemons' peers were counted
    membership: MembershipConfig  #: the daemons' membership config
    discovery: DiscoveryConfig  #: and their discovery config (rendezvous records)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    #: processing delays measured on the daemons (ms): each node's delay before it stores a
    #: version it received is drawn from them (none given: it stores at once)
    processing_ms: tuple[float, ...] = ()
    seed: int = 1

    @property
    def n(self) -> int:
        return len(self.start_ms)

    def median_latency_ms(self) -> float:
        return statistics.median(self.latency_ms.values()) if self.latency_ms else 0.05

    def link_ms(self, i: int, j: int) -> float:
        """The one-way latency of link i-j: as measured, or the median for one never measured."""
        measured = self.latency_ms.get((min(i, j), max(i, j)))
        return self.median_latency_ms() if measured is None else measured


def predict(testnet: DaemonNet) -> dict[str, float]:
    """The simulator's ``peers_per_node``, ``converged_s`` and ``gossip_bytes_per_node_min``
    (and the mean gossip message size, ``gossip_message_bytes``, and the peers each node's
    membership dropped by ``peers_at_ms``, ``peers_dropped``) for ``testnet``."""
    return {**predict_peers(testnet), **predict_ledger(testnet)}


def predict_peers(testnet: DaemonNet) -> dict[str, float]:
    """Mean ready peers per node at ``peers_at_ms``, the overlay built by the machines
    (``peers_per_node``), and the mean number of peers each node's membership had dropped
    by then (``peers_dropped``, each node's last MAX_DROPPED as a daemon's status shows)."""
    latency = LatencyModel(kind="constant", a=testnet.median_latency_ms())
    swarm = Swarm(testnet.seed, latency=latency)
    specs = (membership_spec(testnet.membership), discovery_spec(testnet.discovery))
    for _ in range(testnet.n):
        swarm.add_node(specs, up_bps=LOOPBACK_BPS, down_bps=LOOPBACK_BPS)

    def start(node: VirtualNode) -> None:
        swarm.start(node)
        bootstrap(node, [swarm.nodes[j] for j in testnet.bootstraps[node.index]])

    for node, at in zip(swarm.nodes, testnet.start_ms, strict=True):
        swarm.at_ms(max(0, at), start, node)
    swarm.run(max(testnet.peers_at_ms, max(testnet.start_ms) + 1))
    up = [membership_of(n) for n in swarm.nodes if n.up]
    return {"peers_per_node": statistics.fmean(len(m.ready_peers()) for m in up),
            "peers_dropped": statistics.fmean(len(m.dropped) for m in up)}


def _latency(testnet: DaemonNet) -> LatencyModel:
    """The ledger run's links: one region per node, the matrix holding every link's measured
    one-way latency (the median for a link never measured)."""
    n = testnet.n
    rows = [[testnet.link_ms(i, j) for j in range(n)] for i in range(n)]
    return LatencyModel(region_names=tuple(str(i) for i in range(n)),
                        regions=tuple(tuple(row) for row in rows))


class _Arrivals:
    """When each node's ledger got each (peer, seq) record version (virtual ms): when the
    machine asked to store it, before any processing delay (module doc)."""

    def __init__(self) -> None:
        self.reached: dict[tuple[str, int], dict[int, float]] = {}
        self.swarm: Swarm | None = None

    def observe(self, node: VirtualNode, effect: object) -> None:
        if isinstance(effect, StoreCapability) and self.swarm is not None:
            key = (effect.record.peer_id, effect.record.seq)
            self.reached.setdefault(key, {})[node.index] = self.swarm.now_ms


def predict_ledger(testnet: DaemonNet) -> dict[str, float]:
    """Convergence of the updates and gossip bytes on the daemons' topology."""
    arrivals = _Arrivals()
    spec = ledger_spec(NETWORK_ID, testnet.ledger, lambda node: testnet.specs[node.index],
                       arrivals.observe)
    swarm = arrivals.swarm = Swarm(testnet.seed, latency=_latency(testnet))
    for i in range(testnet.n):
        swarm.add_node((spec,), up_bps=LOOPBACK_BPS, down_bps=LOOPBACK_BPS, region=i)
    for node in swarm.nodes:
        swarm.start(node)
    for i, j in testnet.edges:
        swarm.connect(swarm.nodes[i], swarm.nodes[j])
    swarm.run(SPREAD_MS)
    before = swarm.metrics.bytes_by_kind.get("gossip", 0)
    copies_before = swarm.metrics.counters.get("gossip_copies", 0)
    updated: list[tuple[int, int]] = []  # (node, seq before the update)

    def update(u: Update) -> None:
        node = swarm.nodes[u.node]
        held = _own_seq(arrivals, node.peer_id)
        updated.append((u.node, held))
        node.submit(LEDGER, SetCapability(u.spec))

    for u in testnet.updates:
        swarm.at_ms(SPREAD_MS + u.at_ms, update, u)
    swarm.run(SPREAD_MS + testnet.window_ms)
    sent = swarm.metrics.bytes_by_kind.get("gossip", 0) - before
    copies = swarm.metrics.counters.get("gossip_copies", 0) - copies_before
    # frames carry FRAME_OVERHEAD beyond the message bytes the daemons count
    message_bytes = sent - FRAME_OVERHEAD * copies
    reached = [(i, _reached(arrivals, swarm.nodes[i], seq)) for i, seq in updated]
    complete = [(i, times) for i, times in reached if times is not None]
    return {
        # -1: some update never reached every node
        "converged_s": (expected_convergence_s(complete, testnet.processing_ms, testnet.seed)
                        if complete and len(complete) == len(reached) else -1.0),
        "gossip_bytes_per_node_min": message_bytes / testnet.n / (testnet.window_ms / 60_000),
        "gossip_message_bytes": message_bytes / copies if copies else 0.0,
    }


def _own_seq(arrivals: _Arrivals, peer: str) -> int:
    return max((seq for p, seq in arrivals.reached if p == peer), default=0)


def _reached(arrivals: _Arrivals, node: VirtualNode, before: int) -> dict[int, float] | None:
    """When each node got ``node``'s first record version after ``before``, by node index
    (``node``'s own entry: its signing); None if some node never got it."""
    versions = sorted(seq for p, seq in arrivals.reached if p == node.peer_id and seq > before)
    if not versions:
        return None
    times = arrivals.reached[(node.peer_id, versions[0])]
    return times if len(times) == len(node.swarm.nodes) and node.index in times else None


def expected_convergence_s(reached: list[tuple[int, dict[int, float]]],
                           processing_ms: tuple[float, ...], seed: int) -> float:
    """The mean over DELAY_DRAWS draws of ``converged_s``: the median over the updates
    (``reached``: the updater's index, and each node's arrival of its new version by index)
    of the last node's store minus the updater's, each node but the updater storing its
    arrival plus a delay drawn from ``processing_ms`` (none given: no delay)."""
    rng, delays = random.Random(seed), processing_ms or (0.0,)
    outcomes = []
    for _ in range(DELAY_DRAWS):
        lasts = [max(at + (0.0 if node == origin else rng.choice(delays))
                     for node, at in times.items()) - times[origin]
                 for origin, times in reached]
        outcomes.append(statistics.median(lasts))
    return statistics.fmean(outcomes) / 1000
