"""Voting: accuracy of one executor vs a plain majority vs weighted CoT voting, versus k.

For each executor mix in ``[workload.mixes]`` and each k in ``[sweep] k``, a market swarm
(simulations/workloads/market.py: real auctions, executors and ledgers) answers a Poisson
stream of questions with redundancy k. Each task is scored three ways on the very same
answers: *weighted* (the protocol's outcome: reputation x confidence x match weights),
*majority* (the same vote with neutral weights) and *single* (the first answer to arrive).
A failed task counts as wrong for all three.

Every (mix, k) runs under the protocol's rule (earned reputation, confidence capped by the
track record, independent executors preferred); the k in ``[sweep] today_k`` also run under
the former rule (raw ledger reputation, confidence as claimed), so one run prints both. The
headline's ``colluders`` (the ``adversarial`` mix) and ``praising_colluders`` (``sybil``)
objects hold ``weighted_k3``, ``majority_k3``, ``weighted_k7``, ``majority_k7`` under the
protocol's rule; ``*_today`` the same under the former rule.

``[workload]``: ``requesters`` (4), ``tasks_per_min`` (30), ``deadline_s`` (60),
``slots`` (2), ``questions`` (2000), ``mixes`` (name -> list of executor classes, see
market.py). ``[sweep]``: ``k`` ([1, 3, 5, 7]), ``today_k`` ([3, 7]).

With ``[compute] backend = "models"`` (simulations/compute/models_backend.py) the executors are one real
model sampled at ``[compute] temperature`` with a seed per executor and task, the questions
are the shipped evaluation set, and answers are scored after the daemon's normalization
(``protocol.answers.normalize_answer``); skill and calibration of the mixes are then unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from simulations.runner.report import Plot, Report, Series
from simulations.scenario import Scenario, ScenarioError, workload_value
from simulations.workloads.common import Progress, Stages
from simulations.workloads.market import (
    MarketWorld,
    build_market,
    conservation,
    executor_labels,
    schedule_tasks,
)

QUESTION = (
    "How accurate is the network's answer with one executor, a plain majority of k, and "
    "reputation- and confidence-weighted CoT voting of k, with heterogeneous executors "
    "and adversaries?"
)
#: tasks per point of the accuracy-over-time curve
ROLLING = 40
#: headline object name -> the mix it reports
HEADLINE_MIXES = {"colluders": "adversarial", "praising_colluders": "sybil", "honest": "heterogeneous"}


def _accuracy(world: MarketWorld) -> dict[str, float]:
    recs = [r for r in world.records.values() if r.status]
    n = max(1, len(recs))
    return {
        "weighted": sum(world.correct(r, r.weighted) for r in recs) / n,
        "majority": sum(world.correct(r, r.majority) for r in recs) / n,
        "single": sum(world.correct(r, r.single) for r in recs) / n,
        "failed": sum(1 for r in recs if r.status == "failed") / n,
    }


def _rolling(world: MarketWorld, how: str) -> tuple[list[float], list[float]]:
    recs = sorted((r for r in world.records.values() if r.status), key=lambda r: r.ended_ms)
    xs, ys = [], []
    for i in range(ROLLING, len(recs) + 1, max(1, ROLLING // 4)):
        window = recs[i - ROLLING : i]
        xs.append(window[-1].ended_ms / 60_000)
        ys.append(sum(world.correct(r, getattr(r, how)) for r in window) / ROLLING)
    return xs, ys


@dataclass
class VotingSweep:
    """What the runs of every (mix, k) gave."""

    mixes: dict[str, Any]
    ks: list[int]
    #: the k also run under the former rule
    today_ks: list[int] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: mix -> "weighted"/"majority" -> rolling accuracy over time, at the largest k
    curves: dict[str, dict[str, tuple[list[float], list[float]]]] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    per_label: dict[str, dict[str, float]] = field(default_factory=dict)
    solves: int = 0
    identity: str = ""


def run(scenario: Scenario, progress: Progress) -> Report:
    mixes: dict[str, Any] = scenario.workload.get("mixes") or {
        "heterogeneous": scenario.workload.get("executors") or [{"share": 1.0}]
    }
    ks = [int(k) for k in scenario.sweep.get("k", [1, 3, 5, 7])]
    if any(not 1 <= k <= 16 for k in ks):
        raise ScenarioError(f"{scenario.name} [sweep] k: every k must be in 1..16")
    today_ks = [int(k) for k in scenario.sweep.get("today_k", [3, 7]) if int(k) in ks]
    sweep = VotingSweep(mixes, ks, today_ks)
    runs = len(mixes) * (len(ks) + len(today_ks))
    _run_sweep(scenario, sweep, Stages(progress, [1.0] * runs))
    results, notes = _results(scenario, sweep)
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=_headline(sweep),
        results=results,
        plots=_plots(sweep),
        invariants={
            "every_task_ended_exactly_once": all(
                c["every_task_ended_exactly_once"] for c in sweep.checks
            ),
            "tasks_never_ended": sum(c["tasks_never_ended"] for c in sweep.checks),
            "violations": [v for c in sweep.checks for v in c["violations"]][:10],
        },
        notes=notes,
    )


def _run_sweep(scenario: Scenario, sweep: VotingSweep, stages: Stages) -> None:
    """One market run per (mix, k, rule), measured into ``sweep``."""
    for mix_name, classes in sweep.mixes.items():
        sc = replace(scenario, workload={**scenario.workload, "executors": classes})
        runs = [(k, "earned") for k in sweep.ks] + [(k, "today") for k in sweep.today_ks]
        for k, rule in runs:
            world = _run_one(sc, k, max(sweep.ks), rule, stages, f"{mix_name} k={k} {rule}")
            acc = _accuracy(world)
            sweep.rows.append({"mix": mix_name, "k": k, "rule": rule, **acc,
                               "tasks": len(world.records)})
            sweep.checks.append(conservation(world))
            if scenario.compute.real:
                sweep.solves += world.compute.solves
                sweep.identity = world.compute.identity
            if k == max(sweep.ks) and rule == "earned":
                sweep.curves[mix_name] = {
                    how: _rolling(world, how) for how in ("weighted", "majority")
                }
                sweep.per_label[mix_name] = _label_reputation(world)


def _run_one(
    scenario: Scenario, k: int, max_k: int, rule: str, stages: Stages, label: str
) -> MarketWorld:
    """One market run answering the scenario's questions with redundancy ``k``."""
    n_req = int(workload_value(scenario, "requesters", 4))
    n_exec = max(max_k + 1, scenario.nodes - n_req)
    duration_ms = int(scenario.duration_s * 1000)
    deadline_ms = int(float(workload_value(scenario, "deadline_s", 60.0)) * 1000)
    world = build_market(scenario, n_exec=n_exec, n_req=n_req, seed=scenario.seed, rule=rule)
    schedule_tasks(
        world,
        start_ms=10_000,
        end_ms=duration_ms,
        per_min=float(workload_value(scenario, "tasks_per_min", 30.0)),
        k=k,
        deadline_ms=deadline_ms,
    )
    stages.run(world.swarm, duration_ms + deadline_ms + 5_000, label)
    stages.next()
    return world


def _plots(sweep: VotingSweep) -> list[Plot]:
    plots = []
    for mix_name in sweep.mixes:
        mine = [r for r in sweep.rows if r["mix"] == mix_name and r["rule"] == "earned"]
        xs = [float(r["k"]) for r in mine]
        plots.append(
            Plot(
                f"accuracy_vs_k_{mix_name}",
                f"Accuracy vs k ({mix_name} executors)",
                "k (executors per task)",
                "fraction of tasks answered correctly",
                series=[
                    Series("weighted CoT vote (protocol)", xs, [r["weighted"] for r in mine]),
                    Series("plain majority of k", xs, [r["majority"] for r in mine]),
                    Series("single executor (first answer)", xs, [r["single"] for r in mine]),
                ],
            )
        )
    for mix_name, curve in sweep.curves.items():
        plots.append(
            Plot(
                f"accuracy_over_time_{mix_name}",
                f"Accuracy over time at k={max(sweep.ks)} ({mix_name}), rolling {ROLLING} tasks",
                "virtual minutes",
                "accuracy",
                series=[
                    Series("weighted", *curve["weighted"]),
                    Series("majority", *curve["majority"]),
                ],
            )
        )
    return plots


def _headline(sweep: VotingSweep) -> dict[str, Any]:
    ks = sweep.ks
    earned = [r for r in sweep.rows if r["rule"] == "earned"]
    best = max(earned, key=lambda r: (r["weighted"], -r["k"]))
    headline: dict[str, Any] = {}
    for mix_name in sweep.mixes:
        by_k = {r["k"]: r for r in earned if r["mix"] == mix_name}
        top = by_k[max(ks)]
        headline[f"{mix_name}_single"] = by_k[min(ks)]["single"]
        headline[f"{mix_name}_majority_k{max(ks)}"] = top["majority"]
        headline[f"{mix_name}_weighted_k{max(ks)}"] = top["weighted"]
    headline["best_weighted"] = best["weighted"]
    for name, mix_name in HEADLINE_MIXES.items():
        for rule, suffix in (("earned", ""), ("today", "_today")):
            rows = {r["k"]: r for r in sweep.rows if r["mix"] == mix_name and r["rule"] == rule}
            figures = {f"{how}_k{k}": rows[k][how] for k in (3, 7) if k in rows
                       for how in ("weighted", "majority")}
            if figures:
                headline[name + suffix] = dict(sorted(figures.items()))
    return headline


def _results(scenario: Scenario, sweep: VotingSweep) -> tuple[dict[str, Any], list[str]]:
    notes = [
        "Majority and single are computed with protocol.market.voting.vote on the same results "
        "the protocol's weighted vote used; failed tasks count as wrong.",
        "Rows with rule 'today' are whole runs under the former rule (raw ledger reputation, "
        "confidence as claimed, no preference for independent executors), same seed.",
    ]
    results: dict[str, Any] = {
        "accuracy": sweep.rows,
        "reputation_by_behaviour_at_max_k": sweep.per_label,
    }
    if scenario.compute.real:
        spec = scenario.compute
        results["real_model"] = {"model": sweep.identity, "solves": sweep.solves}
        notes.append(
            f"Answers from the real model {sweep.identity} at temperature {spec.temperature} "
            f"(max {spec.max_tokens} tokens) on the shipped evaluation set "
            f"(models/data/evalset.jsonl); compute time: {spec.time}."
        )
    return results, notes


def _label_reputation(world: MarketWorld) -> dict[str, float]:
    """Mean ledger reputation of each executor class, as the first requester sees it."""
    from simulations.machines.adversary import unwrap

    labels = executor_labels(world)
    requester = world.swarm.nodes[world.requesters[0]]
    slot = requester.slots.get("ledger")
    if slot is None:
        return {}
    view = unwrap(slot.machine).view
    sums: dict[str, list[float]] = {}
    now = world.swarm.machine_now_ms
    for peer, label in labels.items():
        sums.setdefault(label, []).append(view.reputation(peer, now).score)
    return {label: sum(v) / len(v) for label, v in sorted(sums.items())}
