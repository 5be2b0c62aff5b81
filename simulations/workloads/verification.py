"""Verification: cheater detection and exclusion over time versus the sampling rate p and the
fraction of cheaters, with the verification cost paid.

Requesters run the real ``VerifiedAuction``, executors the real ``VerifiedExecutor`` and the
``Verifier`` role, every node the ledger (verifier candidates come from it). A share of the
executors cheats (``cheat``: "swap" computes with another model than advertised,
"fabricate:<f>" makes up that fraction of fingerprint chunks); fingerprints and checks are
simulated as simulations/machines/verification.py describes. A share of verifiers may be
lazy (always "pass"), which escalation must overcome.

Per run: when each cheater is first convicted (a requester's ``VERIFICATION_FAILED``), the
fraction of cheaters excluded by at least one requester over time, the cheaters' share of accepted
results per minute, false convictions of honest executors (must be 0), and the cost: verifier
compute time over executor compute time.

``[workload]``: ``requesters`` (3), ``tasks_per_min`` (12), ``deadline_s`` (90), ``k`` (3),
``cheat`` ("swap"), ``lazy_verifier_share`` (0.0), ``sample_s`` (60).
``[sweep]``: ``sample_rate`` ([0.05, 0.1, 0.2, 0.5]), ``cheater_share`` ([0.1, 0.3]).
"""

from __future__ import annotations

from typing import Any

from protocol.market.executor import ExecutorConfig, ServedModel
from protocol.ledger.machine import LedgerConfig
from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.records import AttestationKind, Role
from protocol.market.selection import ScoreSelector
from protocol.market.events import AuctionConfig
from protocol.verification.state import VerifyConfig
from simulations.adversary import unwrap
from simulations.compute import DEVICES, CostModel, ExecutorProfile, model_hash, question_bank
from simulations.machines.ledger import ledger_spec
from simulations.machines.market import AUCTION
from simulations.machines.verification import (
    CheckCost,
    FingerprintedCost,
    verified_auction_spec,
    verified_executor_spec,
    verifier_spec,
)
from simulations.node import VirtualNode
from simulations.report import Plot, Report, Series
from simulations.scenario import Scenario, workload_value
from simulations.swarm import derive_rng
from simulations.workloads.common import MODEL_FAMILY, MODEL_NAME, Progress, Stages, capability
from simulations.workloads.market import MarketWorld, conservation, schedule_tasks
from simulations.world import build_swarm

QUESTION = (
    "How fast are cheating executors detected and excluded, versus the sampling rate p "
    "and the fraction of cheaters, and what does verification cost?"
)


def _one(scenario: Scenario, stages: Stages, p: float, share: float) -> dict[str, Any]:
    n_req = int(workload_value(scenario, "requesters", 3))
    n_exec = max(6, scenario.nodes - n_req)
    seed = scenario.seed
    rng = derive_rng(seed, f"verify/{p}/{share}")
    bank = question_bank(rng, 1000, ("math", "code", "facts"))
    backend = FingerprintedCost(CostModel(bank))
    device = DEVICES["rtx3090"]
    checks = CheckCost(device.tokens_per_s)
    mh = model_hash(MODEL_NAME)
    cheat = str(workload_value(scenario, "cheat", "swap"))
    order = list(range(n_req, n_req + n_exec))
    rng.shuffle(order)
    cheaters = set(order[: round(share * n_exec)])
    lazy_share = float(workload_value(scenario, "lazy_verifier_share", 0.0))
    lazy = set(order[len(cheaters) : len(cheaters) + round(lazy_share * n_exec)])
    profiles = {}
    for i in range(n_req, n_req + n_exec):
        profiles[i] = ExecutorProfile(
            device=device,
            skill={"*": 0.7},
            cheat=cheat if i in cheaters else "",
            label="cheater" if i in cheaters else "honest",
        )
    convicted: dict[str, int] = {}
    false_convictions: list[str] = []
    cheater_peers: set[str] = set()

    def on_attest(node: VirtualNode, effect: LedgerAttest) -> None:
        if effect.kind is AttestationKind.VERIFICATION_FAILED:
            if effect.subject in cheater_peers:
                convicted.setdefault(effect.subject, node.swarm.now_ms)
            else:
                false_convictions.append(effect.subject)

    def exec_config(node: VirtualNode) -> ExecutorConfig:
        return ExecutorConfig(
            models=(
                ServedModel(
                    MODEL_NAME, MODEL_FAMILY, 8192, mh, device.tokens_per_s, device.price_per_1k
                ),
            ),
            slots=4,
        )

    verify = VerifyConfig(sample_rate=p)
    led = ledger_spec(
        "sim",
        LedgerConfig(anti_entropy_ms=30_000),
        lambda node: (
            capability(node, device, slots=4, roles=(Role.EXECUTOR, Role.VERIFIER))
            if node.index >= n_req
            else None
        ),
    )
    auc = verified_auction_spec(lambda node: ScoreSelector(), AuctionConfig(), verify, on_attest)
    exe = verified_executor_spec(exec_config, backend)
    ver = verifier_spec(frozenset({mh}), checks, lambda node: node.index in lazy, on_attest=None)
    specs_of = lambda i: (led, auc) if i < n_req else (led, exe, ver)  # noqa: E731
    swarm = build_swarm(scenario, n_req + n_exec, seed, specs_of, lambda i: profiles.get(i))
    cheater_peers.update(swarm.nodes[i].peer_id for i in cheaters)
    world = MarketWorld(
        swarm, backend.cost, bank, list(range(n_req)), list(range(n_req, n_req + n_exec))
    )
    from simulations.workloads.market import _ended

    swarm.on_emit("task.done", lambda node, f, now: _ended(world, node, f, now, "done"))
    swarm.on_emit("task.failed", lambda node, f, now: _ended(world, node, f, now, "failed"))
    accepted: list[tuple[int, bool]] = []
    assigned: set[str] = set()
    swarm.on_emit("task.assigned", lambda node, f, now: assigned.add(str(f.get("peer"))))
    swarm.on_emit(
        "task.result",
        lambda node, f, now: accepted.append((now, str(f.get("peer")) in cheater_peers)),
    )
    duration_ms = int(scenario.duration_s * 1000)
    deadline_ms = int(float(workload_value(scenario, "deadline_s", 90.0)) * 1000)
    schedule_tasks(
        world,
        start_ms=20_000,
        end_ms=duration_ms,
        per_min=float(workload_value(scenario, "tasks_per_min", 12.0)),
        k=int(workload_value(scenario, "k", 3)),
        deadline_ms=deadline_ms,
    )
    sample_ms = int(float(workload_value(scenario, "sample_s", 60.0)) * 1000)
    excluded_curve: list[tuple[float, float]] = []

    def sample() -> None:
        now = swarm.machine_now_ms
        auctions = [unwrap(swarm.nodes[i].machine(AUCTION)) for i in range(n_req)]
        out = sum(1 for peer in cheater_peers if any(a.is_excluded(peer, now) for a in auctions))
        excluded_curve.append((swarm.now_ms / 60_000, out / max(1, len(cheater_peers))))

    for t in range(sample_ms, duration_ms + 1, sample_ms):
        swarm.at_ms(t, sample)
    stages.run(swarm, duration_ms + deadline_ms, f"verify p={p} cheaters={share}")
    stages.next()
    minutes = int(duration_ms // 60_000) + 1
    per_min = [[0, 0] for _ in range(minutes + 2)]
    for t, bad in accepted:
        m = min(len(per_min) - 1, t // 60_000)
        per_min[m][0] += 1
        per_min[m][1] += int(bad)
    share_curve = [(float(m), c[1] / c[0]) for m, c in enumerate(per_min) if c[0]]
    times = sorted((t - 20_000) / 60_000 for t in convicted.values())
    cons = conservation(world)
    return {
        "sample_rate": p,
        "cheater_share": share,
        "cheaters": len(cheaters),
        "lazy_verifiers": len(lazy),
        "cheaters_given_work": len(assigned & cheater_peers),
        "convicted": len(convicted),
        "detected_fraction": len(convicted) / max(1, len(cheaters)),
        "detected_of_working": len(convicted) / max(1, len(assigned & cheater_peers)),
        "median_minutes_to_conviction": times[len(times) // 2] if times else -1.0,
        "excluded_fraction_end": excluded_curve[-1][1] if excluded_curve else 0.0,
        "false_convictions": len(false_convictions),
        "cheater_result_share_first_10min": _mean([s for m, s in share_curve if m < 10]),
        "cheater_result_share_last_10min": _mean([s for m, s in share_curve if m >= minutes - 10]),
        "verify_cost_ratio": checks.check_ms / max(1, backend.compute_ms),
        "checks": checks.checks,
        "tasks": cons["tasks_submitted"],
        "tasks_done": cons["tasks_done"],
        "every_task_ended_exactly_once": cons["every_task_ended_exactly_once"],
        "_excluded": excluded_curve,
        "_share": share_curve,
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def run(scenario: Scenario, progress: Progress) -> Report:
    rates = [float(p) for p in scenario.sweep.get("sample_rate", [0.05, 0.1, 0.2, 0.5])]
    shares = [float(s) for s in scenario.sweep.get("cheater_share", [0.1, 0.3])]
    stages = Stages(progress, [1.0] * len(rates) * len(shares))
    rows = [_one(scenario, stages, p, s) for s in shares for p in rates]
    plots = []
    for s in shares:
        mine = [r for r in rows if r["cheater_share"] == s]
        plots.append(
            Plot(
                f"excluded_{s}",
                f"Cheaters excluded by a requester ({s:.0%} cheaters)",
                "virtual minutes",
                "fraction of cheaters excluded",
                series=[
                    Series(
                        f"p={r['sample_rate']:g}",
                        [t for t, _ in r["_excluded"]],
                        [f for _, f in r["_excluded"]],
                    )
                    for r in mine
                ],
            )
        )
        plots.append(
            Plot(
                f"cheater_results_{s}",
                f"Cheaters' share of accepted results ({s:.0%} cheaters)",
                "virtual minutes",
                "share of accepted results",
                series=[
                    Series(
                        f"p={r['sample_rate']:g}",
                        [t for t, _ in r["_share"]],
                        [f for _, f in r["_share"]],
                    )
                    for r in mine
                ],
            )
        )
    plots.append(
        Plot(
            "cost_vs_p",
            "Verification cost vs sampling rate",
            "sampling rate p",
            "verifier compute / executor compute",
            series=[
                Series(
                    f"{s:.0%} cheaters",
                    [r["sample_rate"] for r in rows if r["cheater_share"] == s],
                    [r["verify_cost_ratio"] for r in rows if r["cheater_share"] == s],
                )
                for s in shares
            ],
        )
    )
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    headline: dict[str, Any] = {}
    for r in rows:
        tag = f"p{r['sample_rate']:g}_c{r['cheater_share']:g}"
        headline[f"{tag}_minutes_to_conviction"] = r["median_minutes_to_conviction"]
        headline[f"{tag}_excluded_end"] = r["excluded_fraction_end"]
        headline[f"{tag}_convicted_of_working_cheaters"] = r["detected_of_working"]
    headline["max_verify_cost_ratio"] = max(r["verify_cost_ratio"] for r in rows)
    headline["false_convictions"] = sum(r["false_convictions"] for r in rows)
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=headline,
        results={"runs": public},
        plots=plots,
        invariants={
            "no_honest_executor_convicted": all(r["false_convictions"] == 0 for r in rows),
            "every_task_ended_exactly_once": all(r["every_task_ended_exactly_once"] for r in rows),
        },
        notes=[
            "The score selector ranks identical bids alike, so some executors (cheaters "
            "included) never get work; 'convicted of working cheaters' counts only cheaters "
            "that were assigned at least one task.",
            "Convicted: a requester decided FAIL and attested VERIFICATION_FAILED. Excluded: "
            "a requester's VerifiedAuction refuses the peer's bids (exclusion_ms); other "
            "requesters learn of it only through the ledger (reputation), as in the daemon, "
            "which passes no exclusion callback.",
            "Cost counts the verifiers' prefill of sampled chunks against the executors' "
            "generation, both from the compute model.",
        ],
    )
