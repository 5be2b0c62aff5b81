"""The relay scenario's world: a swarm of relay machines, the manifests it relays, and who
finished each version when (simulations/workloads/relay.py reports on it).

* ``build_world``: N + 1 nodes (node 0 publishes), each link ``link_mbps`` up and down or,
  with a ``mix``, a share of each listed rate (heterogeneous links); every recipient
  advertises its own uplink (the publisher knows what each measured), or 1 B/s for a star.
* ``relay_version``: publish a version naming the recipients ``plan_recipients`` gives
  (protocol/relay/recipients.py: peers that children reported as withholding become leaves)
  and run until every honest, present peer holds it or time is up; ``leave_share`` of the
  recipients leave (crash) halfway through S/B.
* ``ideal_s``: the time the slowest needed link forces: the publisher's uplink carrying S,
  the slowest recipient's downlink carrying S, and all uplinks together carrying N * S.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from crypto.hashing import digest
from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.records import AttestationKind
from protocol.relay.manifest import Manifest, make_body, sign_manifest
from protocol.relay.recipients import plan_recipients, withholders
from protocol.relay.striping import DEFAULT_STRIPES
from simulations.machines.adversary import FreeRider
from simulations.machines.relay import Published, publish, relay_spec
from simulations.network import MBIT
from simulations.node import VirtualNode
from simulations.runner.world import build_swarm
from simulations.scenario import BandwidthClass, Scenario, workload_value
from simulations.swarm import Swarm, derive_rng
from simulations.workloads.common import Stages

MIB = 1 << 20
STAR_ADVERTISED_BPS = 1
#: a run stops this long after the S/B * N bound, complete or not
MAX_RUN_FACTOR = 1.5
#: virtual time at which the publisher announces the first version
START_MS = 1_000


@dataclass
class RelayRun:
    """One run's world: the swarm, what it relays, and who finished which version when."""

    swarm: Swarm
    topology: str
    size: int
    chunk: int
    link_bps: float
    riders: set[int]
    published: Published
    seed: int
    #: manifest id -> node index -> virtual ms it completed
    done: dict[bytes, dict[int, int]] = field(default_factory=dict)
    #: (subject, observer) of every RELAY_WITHHELD attestation made
    withheld: list[tuple[str, str]] = field(default_factory=list)
    left: set[int] = field(default_factory=set)

    @property
    def n(self) -> int:
        return len(self.swarm.nodes) - 1

    @property
    def s_over_b(self) -> float:
        return self.size / self.link_bps

    def honest_present(self) -> list[int]:
        return [i for i in range(1, self.n + 1) if i not in self.riders and i not in self.left]


def _fanout(topology: str, n: int) -> int:
    return n if topology == "star" else (1 if topology == "chain" else 8)


def stripes_of(topology: str) -> int:
    """The striped plan runs DEFAULT_STRIPES trees; every other topology is one tree."""
    return DEFAULT_STRIPES if topology == "striped" else 1


def fanout_of(topology: str, n: int) -> int:
    return _fanout(topology, n)


def build_world(
    scenario: Scenario,
    n: int,
    topology: str,
    chunk_mib: float,
    *,
    free_riders: float = 0.0,
    mix: tuple[float, ...] = (),
) -> RelayRun:
    """N + 1 nodes, equal links (or a mix of rates in Mbit/s), the free riders chosen."""
    size = int(float(workload_value(scenario, "size_mib", 256.0)) * MIB)
    link_bps = float(workload_value(scenario, "link_mbps", 100.0)) * MBIT
    rates = [r * MBIT for r in mix] or [link_bps]
    classes = tuple(BandwidthClass(1.0 / len(rates), r, r) for r in rates)
    sc = replace(scenario, network=replace(scenario.network, bandwidth=classes))
    rng = derive_rng(scenario.seed, f"relay/{n}/{topology}/{chunk_mib}/{free_riders}/{mix}")
    riders = set(rng.sample(range(1, n + 1), round(free_riders * n))) if free_riders else set()
    run_box: list[RelayRun] = []

    def on_complete(node: VirtualNode, manifest: Any) -> None:
        run_box[0].done.setdefault(manifest.id, {}).setdefault(node.index, node.swarm.now_ms)

    def on_attest(node: VirtualNode, attestation: LedgerAttest) -> None:
        if attestation.kind is AttestationKind.RELAY_WITHHELD:
            run_box[0].withheld.append((attestation.subject, node.peer_id))

    published = Published()
    spec = relay_spec(
        max_fanout=_fanout(topology, n),
        stripes=stripes_of(topology),
        window=int(workload_value(scenario, "window", 8)),
        published=published,
        on_complete=on_complete,
        on_attest=on_attest,
        behaviour_of=lambda node: FreeRider() if node.index in riders else None,
    )
    swarm = build_swarm(sc, n + 1, scenario.seed, lambda i: (spec,))
    # the slowest link sets S/B for mixed links
    link = min(min(swarm.net.up_bps), min(swarm.net.down_bps)) if mix else link_bps
    run = RelayRun(
        swarm, topology, size, int(chunk_mib * MIB), link, riders, published, scenario.seed
    )
    run_box.append(run)
    return run


def ideal_s(run: RelayRun) -> float:
    """The time the slowest needed link forces (see the module docstring)."""
    net = run.swarm.net
    present = [i for i in range(1, run.n + 1) if i not in run.left]
    uploads = net.up_bps[0] + sum(net.up_bps[i] for i in present if i not in run.riders)
    return max(
        run.size / net.up_bps[0],
        run.size / min(net.down_bps[i] for i in present),
        len(present) * run.size / uploads,
    )


def _manifest(run: RelayRun, version: int) -> Manifest:
    nodes = run.swarm.nodes
    net = run.swarm.net
    chunks = -(-run.size // run.chunk)
    hashes = [digest(f"{version}/{i}".encode(), person=b"sim-chunk") for i in range(chunks)]
    if run.topology == "star":
        uploads = {nodes[i].peer_id: STAR_ADVERTISED_BPS for i in range(1, run.n + 1)}
    else:
        uploads = {nodes[i].peer_id: int(net.up_bps[i]) for i in range(1, run.n + 1)}
    recipients = plan_recipients(uploads, uploads, withholders(run.withheld))
    body = make_body(
        name="weights",
        version=version,
        chunk_size=run.chunk,
        chunk_hashes=hashes,
        total_size=run.size,
        publisher_upload_bps=int(net.up_bps[0]),
        recipients=recipients,
    )
    return sign_manifest(nodes[0].identity, body)


def relay_version(
    run: RelayRun, stages: Stages, label: str, version: int = 1, leave_share: float = 0.0
) -> tuple[Manifest, int]:
    """Publish ``version`` and run until every honest present peer holds it or time is up;
    returns the manifest and the virtual ms it was published at."""
    swarm = run.swarm
    manifest = _manifest(run, version)
    start = max(START_MS, swarm.now_ms + 1_000)
    swarm.at_ms(start, publish, swarm.nodes[0], manifest, run.published)
    if leave_share > 0:
        rng = derive_rng(run.seed, f"relay-leave/{version}")
        leavers = rng.sample(range(1, run.n + 1), round(leave_share * run.n))
        run.left.update(leavers)
        at = start + int(run.s_over_b * 500)
        for i in leavers:
            swarm.at_ms(at, swarm.crash, swarm.nodes[i])
    s_over_b = run.s_over_b
    limit_ms = start + int(max(s_over_b * run.n, s_over_b * 4) * 1000 * MAX_RUN_FACTOR) + 120_000
    step = max(1_000, int(s_over_b * 1000 / 4))
    t = swarm.now_ms
    done = run.done.setdefault(manifest.id, {})
    wanted = run.honest_present
    while t < limit_ms and not all(i in done for i in wanted()):
        t = min(limit_ms, t + step)
        stages.run(swarm, t, label)
    stages.next()
    return manifest, start
