"""Voting: accuracy of one executor vs a plain majority vs weighted CoT voting, versus k.

For each executor mix in ``[workload.mixes]`` and each k in ``[sweep] k``, a market swarm
(simulations/workloads/market.py: real auctions, executors and ledgers) answers a Poisson
stream of questions with redundancy k. Each task is scored three ways on the very same
answers: *weighted* (the protocol's outcome: reputation x confidence x match weights),
*majority* (the same vote with neutral weights) and *single* (the first answer to arrive).
A failed task counts as wrong for all three.

``[workload]``: ``requesters`` (4), ``tasks_per_min`` (30), ``deadline_s`` (60),
``slots`` (2), ``questions`` (2000), ``mixes`` (name -> list of executor classes, see
market.py). ``[sweep]``: ``k`` ([1, 3, 5, 7]).

With ``[compute] backend = "models"`` (simulations/models_compute.py) the executors are one real
model sampled at ``[compute] temperature`` with a seed per executor and task, the questions
are the shipped evaluation set, and answers are scored after the daemon's normalization
(``protocol.answers.normalize_answer``); skill and calibration of the mixes are then unused.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulations.report import Plot, Report, Series
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


def run(scenario: Scenario, progress: Progress) -> Report:
    mixes: dict[str, Any] = scenario.workload.get("mixes") or {
        "heterogeneous": scenario.workload.get("executors") or [{"share": 1.0}]
    }
    ks = [int(k) for k in scenario.sweep.get("k", [1, 3, 5, 7])]
    if any(not 1 <= k <= 16 for k in ks):
        raise ScenarioError(f"{scenario.name} [sweep] k: every k must be in 1..16")
    n_req = int(workload_value(scenario, "requesters", 4))
    n_exec = max(max(ks) + 1, scenario.nodes - n_req)
    duration_ms = int(scenario.duration_s * 1000)
    per_min = float(workload_value(scenario, "tasks_per_min", 30.0))
    deadline_ms = int(float(workload_value(scenario, "deadline_s", 60.0)) * 1000)
    stages = Stages(progress, [1.0] * len(mixes) * len(ks))
    rows: list[dict[str, Any]] = []
    curves: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    checks: list[dict[str, Any]] = []
    per_label: dict[str, dict[str, float]] = {}
    solves = 0
    identity = ""
    for mix_name, classes in mixes.items():
        sc = replace(scenario, workload={**scenario.workload, "executors": classes})
        for k in ks:
            world = build_market(sc, n_exec=n_exec, n_req=n_req, seed=scenario.seed)
            schedule_tasks(
                world,
                start_ms=10_000,
                end_ms=duration_ms,
                per_min=per_min,
                k=k,
                deadline_ms=deadline_ms,
            )
            stages.run(world.swarm, duration_ms + deadline_ms + 5_000, f"{mix_name} k={k}")
            stages.next()
            acc = _accuracy(world)
            rows.append({"mix": mix_name, "k": k, **acc, "tasks": len(world.records)})
            checks.append(conservation(world))
            if scenario.compute.real:
                solves += world.compute.solves
                identity = world.compute.identity
            if k == max(ks):
                curves[mix_name] = {how: _rolling(world, how) for how in ("weighted", "majority")}
                per_label[mix_name] = _label_reputation(world)
    plots = []
    for mix_name in mixes:
        mine = [r for r in rows if r["mix"] == mix_name]
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
    for mix_name, curve in curves.items():
        plots.append(
            Plot(
                f"accuracy_over_time_{mix_name}",
                f"Accuracy over time at k={max(ks)} ({mix_name}), rolling {ROLLING} tasks",
                "virtual minutes",
                "accuracy",
                series=[
                    Series("weighted", *curve["weighted"]),
                    Series("majority", *curve["majority"]),
                ],
            )
        )
    best = max(rows, key=lambda r: (r["weighted"], -r["k"]))
    headline: dict[str, Any] = {}
    for mix_name in mixes:
        by_k = {r["k"]: r for r in rows if r["mix"] == mix_name}
        top = by_k[max(ks)]
        headline[f"{mix_name}_single"] = by_k[min(ks)]["single"]
        headline[f"{mix_name}_majority_k{max(ks)}"] = top["majority"]
        headline[f"{mix_name}_weighted_k{max(ks)}"] = top["weighted"]
    headline["best_weighted"] = best["weighted"]
    notes = [
        "Majority and single are computed with protocol.market.voting.vote on the same results "
        "the protocol's weighted vote used; failed tasks count as wrong."
    ]
    results: dict[str, Any] = {"accuracy": rows, "reputation_by_behaviour_at_max_k": per_label}
    if scenario.compute.real:
        spec = scenario.compute
        results["real_model"] = {"model": identity, "solves": solves}
        notes.append(
            f"Answers from the real model {identity} at temperature {spec.temperature} "
            f"(max {spec.max_tokens} tokens) on the shipped evaluation set "
            f"(models/data/evalset.jsonl); compute time: {spec.time}."
        )
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=headline,
        results=results,
        plots=plots,
        invariants={
            "every_task_ended_exactly_once": all(
                c["every_task_ended_exactly_once"] for c in checks
            ),
            "tasks_never_ended": sum(c["tasks_never_ended"] for c in checks),
            "violations": [v for c in checks for v in c["violations"]][:10],
        },
        notes=notes,
    )


def _label_reputation(world: MarketWorld) -> dict[str, float]:
    """Mean ledger reputation of each executor class, as the first requester sees it."""
    from simulations.adversary import unwrap

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
