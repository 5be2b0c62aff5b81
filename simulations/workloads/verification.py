"""Verification: cheater detection and exclusion over time versus the sampling rate p and the
fraction of cheaters, with the verification cost paid.

Requesters run the real ``VerifiedAuction``, executors the real ``VerifiedExecutor`` and the
``Verifier`` role, every node the ledger (verifier candidates and network-wide exclusions come
from it, as in the daemon). A share of the executors cheats (``cheat``: "swap" computes with
another model than advertised, "fabricate:<f>" fakes that fraction of layers); commitments and
checks are the daemon's default layer-state scheme, simulated as simulations/
verification_cost.py describes. A share of verifiers may be lazy (always "pass"), which
escalation must overcome.

Per run: when each cheater is first convicted (a requester's ``VERIFICATION_FAILED``), the
fraction of cheaters excluded by at least one requester over time, the cheaters' share of accepted
results per minute, false convictions of honest executors (must be 0), and the cost: verifier
compute time over executor generation time, and the executors' commitments over it.

``[workload]``: ``requesters`` (3), ``tasks_per_min`` (12), ``deadline_s`` (90), ``k`` (3),
``cheat`` ("swap"), ``lazy_verifier_share`` (0.0), ``sample_s`` (60), ``layer_states`` (true;
false: executors commit fingerprints only and checks re-run a prefill of the sampled chunks).
``[sweep]``: ``sample_rate`` ([0.05, 0.1, 0.2, 0.5]), ``cheater_share`` ([0.1, 0.3]).
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import Any

from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.machine import LedgerConfig
from protocol.ledger.records import AttestationKind, Role
from protocol.market.events import AuctionConfig
from protocol.market.executor import ExecutorConfig, ServedModel
from protocol.market.selection import ScoreSelector
from protocol.verification.state import VerifyConfig
from simulations.compute.cost import DEVICES, CostModel, ExecutorProfile, model_hash, question_bank
from simulations.compute.verification import CheckCost, CommittingCost
from simulations.machines.adversary import unwrap
from simulations.machines.ledger import ledger_spec
from simulations.machines.market import AUCTION
from simulations.machines.verification import (
    verified_auction_spec,
    verified_executor_spec,
    verifier_spec,
)
from simulations.node import VirtualNode
from simulations.runner.report import Plot, Report, Series
from simulations.runner.world import build_swarm
from simulations.scenario import Scenario, workload_value
from simulations.swarm import Swarm, derive_rng
from simulations.workloads.common import MODEL_FAMILY, MODEL_NAME, Progress, Stages, capability
from simulations.workloads.market import (
    MarketWorld,
    conservation,
    schedule_tasks,
    watch_task_ends,
)

DEVICE = DEVICES["rtx3090"]
#: tasks start once the ledger has spread every executor's capability record
TASKS_START_MS = 20_000

QUESTION = (
    "How fast are cheating executors detected and excluded, versus the sampling rate p "
    "and the fraction of cheaters, and what does verification cost?"
)


@dataclass
class Population:
    """Who is who in one run: requesters first, then executors (also verifiers)."""

    n_req: int
    n_exec: int
    cheaters: set[int]
    lazy: set[int]
    profiles: dict[int, ExecutorProfile]


def _population(scenario: Scenario, rng: Random, share: float) -> Population:
    n_req = int(workload_value(scenario, "requesters", 3))
    n_exec = max(6, scenario.nodes - n_req)
    cheat = str(workload_value(scenario, "cheat", "swap"))
    order = list(range(n_req, n_req + n_exec))
    rng.shuffle(order)
    cheaters = set(order[: round(share * n_exec)])
    lazy_share = float(workload_value(scenario, "lazy_verifier_share", 0.0))
    lazy = set(order[len(cheaters) : len(cheaters) + round(lazy_share * n_exec)])
    profiles = {
        i: ExecutorProfile(
            device=DEVICE,
            skill={"*": 0.7},
            cheat=cheat if i in cheaters else "",
            label="cheater" if i in cheaters else "honest",
        )
        for i in range(n_req, n_req + n_exec)
    }
    return Population(n_req, n_exec, cheaters, lazy, profiles)


class Observer:
    """What a run records: convictions, accepted results, assignments, exclusion over time."""

    def __init__(self) -> None:
        self.cheater_peers: set[str] = set()
        self.convicted: dict[str, int] = {}
        self.false_convictions: list[str] = []
        self.accepted: list[tuple[int, bool]] = []
        self.assigned: set[str] = set()
        self.excluded_curve: list[tuple[float, float]] = []

    def on_attest(self, node: VirtualNode, effect: LedgerAttest) -> None:
        if effect.kind is AttestationKind.VERIFICATION_FAILED:
            if effect.subject in self.cheater_peers:
                self.convicted.setdefault(effect.subject, node.swarm.now_ms)
            else:
                self.false_convictions.append(effect.subject)

    def install(self, swarm: Swarm, world: MarketWorld) -> None:
        watch_task_ends(swarm, world)
        swarm.on_emit("task.assigned", lambda node, f, now: self.assigned.add(str(f.get("peer"))))
        swarm.on_emit(
            "task.result",
            lambda node, f, now: self.accepted.append(
                (now, str(f.get("peer")) in self.cheater_peers)
            ),
        )

    def sample(self, swarm: Swarm, requesters: list[int]) -> None:
        """The fraction of cheaters some requester's auction excludes now."""
        now = swarm.machine_now_ms
        auctions = [unwrap(swarm.nodes[i].machine(AUCTION)) for i in requesters]
        out = sum(
            1 for peer in self.cheater_peers if any(a.is_excluded(peer, now) for a in auctions)
        )
        self.excluded_curve.append((swarm.now_ms / 60_000, out / max(1, len(self.cheater_peers))))

    def share_curve(self, minutes: int) -> list[tuple[float, float]]:
        """Per virtual minute: the cheaters' share of the accepted results."""
        per_min = [[0, 0] for _ in range(minutes + 2)]
        for t, bad in self.accepted:
            m = min(len(per_min) - 1, t // 60_000)
            per_min[m][0] += 1
            per_min[m][1] += int(bad)
        return [(float(m), c[1] / c[0]) for m, c in enumerate(per_min) if c[0]]


def _build(
    scenario: Scenario,
    pop: Population,
    p: float,
    observer: Observer,
    backend: CommittingCost,
    checks: CheckCost,
) -> Swarm:
    """The swarm: every node a ledger; requesters an auction, executors executor + verifier."""
    mh = model_hash(MODEL_NAME)
    n_req = pop.n_req

    def exec_config(node: VirtualNode) -> ExecutorConfig:
        served = ServedModel(
            MODEL_NAME, MODEL_FAMILY, 8192, mh, DEVICE.tokens_per_s, DEVICE.price_per_1k
        )
        return ExecutorConfig(models=(served,), slots=4)

    roles = (Role.EXECUTOR, Role.VERIFIER)
    led = ledger_spec(
        "sim",
        LedgerConfig(anti_entropy_ms=30_000),
        lambda node: (
            capability(node, DEVICE, slots=4, roles=roles) if node.index >= n_req else None
        ),
    )
    verify = VerifyConfig(sample_rate=p)
    auc = verified_auction_spec(
        lambda node: ScoreSelector(), AuctionConfig(), verify, observer.on_attest
    )
    exe = verified_executor_spec(exec_config, backend)
    ver = verifier_spec(frozenset({mh}), checks, lambda node: node.index in pop.lazy)
    specs_of = lambda i: (led, auc) if i < n_req else (led, exe, ver)  # noqa: E731
    total = n_req + pop.n_exec
    return build_swarm(scenario, total, scenario.seed, specs_of, lambda i: pop.profiles.get(i))


def _one(scenario: Scenario, stages: Stages, p: float, share: float) -> dict[str, Any]:
    rng = derive_rng(scenario.seed, f"verify/{p}/{share}")
    bank = question_bank(rng, 1000, ("math", "code", "facts"))
    backend = CommittingCost(
        CostModel(bank), layer_states=bool(workload_value(scenario, "layer_states", True))
    )
    checks = CheckCost(DEVICE.tokens_per_s, backend)
    pop = _population(scenario, rng, share)
    observer = Observer()
    swarm = _build(scenario, pop, p, observer, backend, checks)
    observer.cheater_peers.update(swarm.nodes[i].peer_id for i in pop.cheaters)
    requesters = list(range(pop.n_req))
    world = MarketWorld(
        swarm, backend.cost, bank, requesters, list(range(pop.n_req, pop.n_req + pop.n_exec))
    )
    observer.install(swarm, world)
    duration_ms = int(scenario.duration_s * 1000)
    deadline_ms = int(float(workload_value(scenario, "deadline_s", 90.0)) * 1000)
    schedule_tasks(
        world,
        start_ms=TASKS_START_MS,
        end_ms=duration_ms,
        per_min=float(workload_value(scenario, "tasks_per_min", 12.0)),
        k=int(workload_value(scenario, "k", 3)),
        deadline_ms=deadline_ms,
    )
    sample_ms = int(float(workload_value(scenario, "sample_s", 60.0)) * 1000)
    for t in range(sample_ms, duration_ms + 1, sample_ms):
        swarm.at_ms(t, observer.sample, swarm, requesters)
    stages.run(swarm, duration_ms + deadline_ms, f"verify p={p} cheaters={share}")
    stages.next()
    return _row(p, share, pop, observer, backend, checks, world, int(duration_ms // 60_000) + 1)


def _row(
    p: float,
    share: float,
    pop: Population,
    observer: Observer,
    backend: CommittingCost,
    checks: CheckCost,
    world: MarketWorld,
    minutes: int,
) -> dict[str, Any]:
    """One run's results (keys starting with "_" are curves for the plots)."""
    share_curve = observer.share_curve(minutes)
    times = sorted((t - TASKS_START_MS) / 60_000 for t in observer.convicted.values())
    working = observer.assigned & observer.cheater_peers
    curve = observer.excluded_curve
    cons = conservation(world)
    generation_ms = max(1, backend.compute_ms)
    return {
        "sample_rate": p,
        "cheater_share": share,
        "cheaters": len(pop.cheaters),
        "lazy_verifiers": len(pop.lazy),
        "cheaters_given_work": len(working),
        "convicted": len(observer.convicted),
        "detected_fraction": len(observer.convicted) / max(1, len(pop.cheaters)),
        "detected_of_working": len(observer.convicted) / max(1, len(working)),
        "median_minutes_to_conviction": times[len(times) // 2] if times else -1.0,
        "excluded_fraction_end": curve[-1][1] if curve else 0.0,
        "false_convictions": len(observer.false_convictions),
        "cheater_result_share_first_10min": _mean([s for m, s in share_curve if m < 10]),
        "cheater_result_share_last_10min": _mean([s for m, s in share_curve if m >= minutes - 10]),
        "verify_cost_ratio": checks.check_ms / generation_ms,
        "commit_cost_ratio": backend.commit_ms / generation_ms,
        "state_bytes_per_check": checks.fetch_bytes / max(1, checks.checks),
        "checks": checks.checks,
        "tasks": cons["tasks_submitted"],
        "tasks_done": cons["tasks_done"],
        "every_task_ended_exactly_once": cons["every_task_ended_exactly_once"],
        "_excluded": curve,
        "_share": share_curve,
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _curves(rows: list[dict[str, Any]], key: str) -> list[Series]:
    return [
        Series(f"p={r['sample_rate']:g}", [t for t, _ in r[key]], [f for _, f in r[key]])
        for r in rows
    ]


def _plots(rows: list[dict[str, Any]], shares: list[float]) -> list[Plot]:
    plots = []
    for s in shares:
        mine = [r for r in rows if r["cheater_share"] == s]
        plots.append(
            Plot(
                f"excluded_{s}",
                f"Cheaters excluded by a requester ({s:.0%} cheaters)",
                "virtual minutes",
                "fraction of cheaters excluded",
                series=_curves(mine, "_excluded"),
            )
        )
        plots.append(
            Plot(
                f"cheater_results_{s}",
                f"Cheaters' share of accepted results ({s:.0%} cheaters)",
                "virtual minutes",
                "share of accepted results",
                series=_curves(mine, "_share"),
            )
        )
    cost = [
        Series(
            f"{s:.0%} cheaters",
            [r["sample_rate"] for r in rows if r["cheater_share"] == s],
            [r["verify_cost_ratio"] for r in rows if r["cheater_share"] == s],
        )
        for s in shares
    ]
    plots.append(
        Plot(
            "cost_vs_p",
            "Verification cost vs sampling rate",
            "sampling rate p",
            "verifier compute / executor compute",
            series=cost,
        )
    )
    return plots


def _headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    headline: dict[str, Any] = {}
    for r in rows:
        tag = f"p{r['sample_rate']:g}_c{r['cheater_share']:g}"
        headline[f"{tag}_minutes_to_conviction"] = r["median_minutes_to_conviction"]
        headline[f"{tag}_excluded_end"] = r["excluded_fraction_end"]
        headline[f"{tag}_convicted_of_working_cheaters"] = r["detected_of_working"]
        headline[f"{tag}_verify_cost_ratio"] = r["verify_cost_ratio"]
    headline["max_verify_cost_ratio"] = max(r["verify_cost_ratio"] for r in rows)
    headline["commit_cost_ratio"] = _mean([r["commit_cost_ratio"] for r in rows])
    headline["false_convictions"] = sum(r["false_convictions"] for r in rows)
    return headline


NOTES = [
    "The score selector ranks identical bids alike, so some executors (cheaters "
    "included) never get work; 'convicted of working cheaters' counts only cheaters "
    "that were assigned at least one task.",
    "Convicted: a requester decided FAIL and attested VERIFICATION_FAILED. Excluded: "
    "a requester's VerifiedAuction refuses the peer's bids, for exclusion_ms after its own "
    "conviction, or while the ledger shows it convicted by others "
    "(protocol.verification.candidates, as in the daemon).",
    "Cost: verify_cost_ratio is the verifiers' layer-state checks (layer 1 and the drawn "
    "layers at the checked positions, simulations/compute/verification.py) over the executors' "
    "generation; commit_cost_ratio is what every committing executor pays for every result, "
    "checked or not: the state capture during generation and hashing the states, as "
    "`symphony bench verify` measures them (an extra prefill without layer states).",
]


def run(scenario: Scenario, progress: Progress) -> Report:
    rates = [float(p) for p in scenario.sweep.get("sample_rate", [0.05, 0.1, 0.2, 0.5])]
    shares = [float(s) for s in scenario.sweep.get("cheater_share", [0.1, 0.3])]
    stages = Stages(progress, [1.0] * len(rates) * len(shares))
    rows = [_one(scenario, stages, p, s) for s in shares for p in rates]
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=_headline(rows),
        results={"runs": public},
        plots=_plots(rows, shares),
        invariants={
            "no_honest_executor_convicted": all(r["false_convictions"] == 0 for r in rows),
            "every_task_ended_exactly_once": all(r["every_task_ended_exactly_once"] for r in rows),
        },
        notes=NOTES,
    )
