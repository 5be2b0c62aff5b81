"""RL rollouts: how busy is a learner fed by N workers, and what does a staleness bound S buy?

Each run is simulations/rl/run.py: one learner driving the protocol's job book
(protocol/rl/jobs.py: validation, the staleness rule, reissues, exclusion), N workers with
heterogeneous speeds and churn, new policy versions reaching each worker after its time in the
relay plan. The sweep crosses S (default 0..8) with N (default 4..1,000); every run is set
beside the capacity rule (protocol/rl/capacity.py) for the same swarm, so the report shows
whether the simulated learner is as busy as the rule says: near 1 when both inequalities hold,
near ``N r T / B`` when supply is short, idle while S is below ``ceil((D + gen) / T)``.

``[workload]`` (defaults): ``batch`` (256 rollouts per step), ``group_size`` (8),
``tokens`` (256 per completion), ``step_s`` (10), ``adapter_mib`` (8), ``chunk_mib`` (1),
``learner_mbps`` (1000, the learner's uplink), ``cheater_share`` (0.02),
``learner_cost_per_h`` (4.0), ``worker_cost_per_h`` (0.3). Worker uplinks come from
``[network] bandwidth``, latency from its median, churn from ``[churn]`` (``crash_per_min``,
``restart_after_s``), the run length from ``duration_s``. ``[sweep]``: ``staleness``
([0, 1, 2, 3, 4, 5, 6, 7, 8]) and ``nodes`` ([4, 16, 64, 256, 1000]); ``--nodes N`` runs that
size only.

Cost per step is the learner's hourly price over the whole run (it is paid while it idles) plus
the workers' hourly price for the time they generate (stale groups included), divided by the
steps taken; ``cost_cut_vs_sync`` is 1 - cost(S) / cost(0) at the same N.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulations.rl.run import run_rl
from simulations.rl.setup import RlFigures, RlSetup
from simulations.runner.report import Plot, Report, Series
from simulations.scenario import Scenario, ScenarioError, workload_value
from simulations.workloads.common import Progress

QUESTION = (
    "How busy is an RL learner fed by N heterogeneous, churning rollout workers under a "
    "staleness bound S, does the capacity rule predict it, and what does raising S from 0 to 8 "
    "save in learner idle time against rollouts wasted as stale?"
)
#: a run holding the capacity rule must keep its learner at least this busy
BUSY_WHEN_HOLDS = 0.9
#: a supply-limited run may beat the rule's bound by this much (jitter, the first batch)
BOUND_SLACK = 0.1


def _setup(scenario: Scenario) -> RlSetup:
    def w(key: str, default: Any) -> Any:
        return workload_value(scenario, key, default)

    net = scenario.network
    uploads = tuple((b.share, float(b.up_bps)) for b in net.bandwidth)
    setup = RlSetup(
        workers=scenario.nodes, staleness=0, batch=w("batch", 256),
        group_size=w("group_size", 8), tokens=w("tokens", 256), step_s=w("step_s", 10.0),
        adapter_mib=w("adapter_mib", 8.0), chunk_mib=w("chunk_mib", 1.0),
        learner_up_bps=w("learner_mbps", 1000.0) * 125_000, uploads=uploads,
        crash_per_min=scenario.churn.crash_per_min,
        restart_after_s=scenario.churn.restart_after_s,
        cheater_share=w("cheater_share", 0.02), duration_s=scenario.duration_s,
        latency_ms=net.latency.a, learner_cost_per_h=w("learner_cost_per_h", 4.0),
        worker_cost_per_h=w("worker_cost_per_h", 0.3))
    for name in ("batch", "group_size", "tokens"):
        if getattr(setup, name) < 1:
            raise ScenarioError(f"{scenario.name} [workload] {name}: must be >= 1")
    if setup.step_s <= 0 or setup.adapter_mib <= 0 or setup.chunk_mib <= 0:
        raise ScenarioError(f"{scenario.name} [workload]: step_s, adapter_mib and chunk_mib "
                            "must be > 0")
    return setup


def _int_list(scenario: Scenario, key: str, default: list[int], lo: int) -> list[int]:
    values = scenario.sweep.get(key, default)
    if not isinstance(values, list) or not values or any(
            type(v) is not int or v < lo for v in values):
        raise ScenarioError(f"{scenario.name} [sweep] {key}: expected a list of ints >= {lo}")
    return values


def _row(f: RlFigures) -> dict[str, Any]:
    p = f.predicted
    assert p is not None  # run_rl always sets it
    return {
        "workers": f.workers, "staleness": f.staleness, "steps": f.steps,
        "busy_fraction": round(f.busy_fraction, 4),
        "learner_idle_s": round(f.learner_idle_s, 1),
        "generated": f.generated, "stale": f.stale, "stale_fraction": round(f.stale_fraction, 4),
        "caught": f.caught, "cheaters": f.cheaters, "honest_excluded": f.honest_excluded,
        "timeouts": f.timeouts,
        "cost_per_step": round(f.cost_per_step, 5),
        "dissemination_s": round(f.dissemination_s, 2), "generation_s": round(f.generation_s, 2),
        "rule_busy_bound": round(p.busy_bound, 4), "rule_min_staleness": p.min_staleness,
        "rule_min_workers": p.min_workers, "rule_holds": p.holds,
    }


def _agrees(row: dict[str, Any]) -> bool:
    """The run behaves as the capacity rule says (see the module doc)."""
    if row["rule_holds"]:
        return bool(row["busy_fraction"] >= BUSY_WHEN_HOLDS)
    return bool(row["busy_fraction"] <= row["rule_busy_bound"] + BOUND_SLACK)


def _cost_cuts(rows: list[dict[str, Any]]) -> None:
    sync = {r["workers"]: r["cost_per_step"] for r in rows if r["staleness"] == 0}
    for r in rows:
        base = sync.get(r["workers"])
        ok = base and base != float("inf") and r["cost_per_step"] != float("inf")
        r["cost_cut_vs_sync"] = round(1 - r["cost_per_step"] / base, 4) if ok else None


def _plots(rows: list[dict[str, Any]], sizes: list[int]) -> list[Plot]:
    busy = Plot("busy_vs_s", "Learner busy fraction vs staleness bound S", "S",
                "busy fraction", hlines=[("goal", BUSY_WHEN_HOLDS)])
    stale = Plot("stale_vs_s", "Rollouts wasted as stale vs S", "S", "stale fraction")
    cost = Plot("cost_vs_s", "Cost per learner step vs S (relative to S = 0)", "S",
                "cost(S) / cost(0)")
    for n in sizes:
        mine = sorted((r for r in rows if r["workers"] == n), key=lambda r: r["staleness"])
        xs = [float(r["staleness"]) for r in mine]
        busy.series.append(Series(f"N={n}", xs, [r["busy_fraction"] for r in mine]))
        stale.series.append(Series(f"N={n}", xs, [r["stale_fraction"] for r in mine]))
        cuts = [r["cost_cut_vs_sync"] for r in mine]
        if all(c is not None for c in cuts):
            cost.series.append(Series(f"N={n}", xs, [1 - c for c in cuts]))
    return [busy, stale, cost]


def _headline(rows: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    top = max(sizes)
    mine = {r["staleness"]: r for r in rows if r["workers"] == top}
    head: dict[str, Any] = {"workers": top, "runs": len(rows),
                            "rule_agrees": sum(_agrees(r) for r in rows)}
    first = min(mine)
    head["rule_min_staleness"] = mine[first]["rule_min_staleness"]
    for s in sorted(mine):
        head[f"busy_s{s}"] = mine[s]["busy_fraction"]
        head[f"stale_s{s}"] = mine[s]["stale_fraction"]
        if mine[s]["cost_cut_vs_sync"] is not None and s > 0:
            head[f"cost_cut_s{s}"] = mine[s]["cost_cut_vs_sync"]
    head["caught"] = sum(r["caught"] for r in rows)
    return head


def run(scenario: Scenario, progress: Progress) -> Report:
    base = _setup(scenario)
    bounds = _int_list(scenario, "staleness", list(range(9)), 0)
    sizes = ([scenario.nodes] if scenario.nodes_overridden
             else _int_list(scenario, "nodes", [4, 16, 64, 256, 1000], 1))
    if 0 not in bounds:
        bounds = [0, *bounds]  # the synchronous baseline every cost is measured against
    runs = [(n, s) for n in sizes for s in bounds]
    total = float(sum(n for n, _ in runs)) or 1.0
    done, rows = 0.0, []
    for n, s in runs:
        progress(done / total, f"N={n} S={s}")
        # the same seed for every S at one N: the same workers, speeds and churn draws
        rows.append(_row(run_rl(replace(base, workers=n, staleness=s), scenario.seed * 7919 + n)))
        done += n
    progress(1.0, "done")
    _cost_cuts(rows)
    return Report(
        scenario=scenario.as_dict(), question=QUESTION, headline=_headline(rows, sizes),
        results={"runs": rows, "rule_disagrees": [
            {"workers": r["workers"], "staleness": r["staleness"]}
            for r in rows if not _agrees(r)]}, plots=_plots(rows, sizes),
        invariants={
            "no_honest_worker_excluded": all(r["honest_excluded"] == 0 for r in rows),
        },
        notes=[
            "The learner side is the protocol's job book; worker speeds, dissemination "
            "(relay plan of the adapter), churn and the learner's step time are cost models.",
            "Completions carry three tokens each on the simulated wire; their time is that "
            "of `tokens` tokens at the worker's speed.",
            f"The rule agrees with a run when it holds and the learner is busy >= "
            f"{BUSY_WHEN_HOLDS}, or it does not hold and the learner is busy no more than the "
            f"rule's bound + {BOUND_SLACK}.",
        ],
    )
