"""The RL rollout workload: the capacity rule reproduced, staleness, cheaters and churn."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulations.rl.run import run_rl
from simulations.rl.setup import RlSetup
from simulations.runner.run import run_scenario
from simulations.scenario import load

#: a small, quick swarm: 64 rollouts per 5 s step
BASE = RlSetup(workers=0, staleness=0, batch=64, group_size=8, tokens=64, step_s=5.0,
               adapter_mib=2.0, duration_s=240.0)


@pytest.mark.parametrize("seed", [1, 2])
def test_when_the_rule_holds_the_learner_is_busy_and_sync_is_not(seed: int) -> None:
    sync = run_rl(replace(BASE, workers=200, staleness=0), seed)
    rule = run_rl(replace(BASE, workers=200, staleness=4), seed)
    assert rule.predicted is not None and rule.predicted.holds, f"seed {seed}"
    assert rule.busy_fraction >= 0.9, f"seed {seed}: {rule.busy_fraction}"
    assert sync.busy_fraction < 0.6 * rule.busy_fraction, f"seed {seed}"
    assert rule.steps > sync.steps and rule.cost_per_step < sync.cost_per_step


@pytest.mark.parametrize("seed", [1, 2])
def test_a_short_supply_caps_the_learner_at_the_rules_bound(seed: int) -> None:
    f = run_rl(replace(BASE, workers=6, staleness=8), seed)
    assert f.predicted is not None and not f.predicted.throughput_ok
    assert f.busy_fraction <= f.predicted.busy_bound + 0.1, f"seed {seed}"
    assert f.steps >= 1


def test_synchronous_mode_never_trains_on_an_older_version() -> None:
    f = run_rl(replace(BASE, workers=50, staleness=0, crash_per_min=0.05), 3)
    assert f.steps > 0 and f.stale == 0  # jobs are only issued for the version being trained


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cheaters_are_caught_and_honest_workers_never_excluded(seed: int) -> None:
    f = run_rl(replace(BASE, workers=60, staleness=2, cheater_share=0.2), seed)
    assert f.cheaters > 0 and f.honest_excluded == 0, f"seed {seed}"
    assert 0 < f.caught <= f.cheaters, f"seed {seed}"


def test_churn_reissues_lost_jobs_and_the_learner_keeps_stepping() -> None:
    calm = run_rl(replace(BASE, workers=100, staleness=3), 5)
    churn = run_rl(replace(BASE, workers=100, staleness=3, crash_per_min=0.2,
                           restart_after_s=30.0), 5)
    assert calm.timeouts == 0 and churn.timeouts > 0
    assert churn.steps >= 0.5 * calm.steps


def test_same_seed_same_figures() -> None:
    setup = replace(BASE, workers=40, staleness=2, crash_per_min=0.05, cheater_share=0.1)
    a, b = run_rl(setup, 9), run_rl(setup, 9)
    assert (a.steps, a.generated, a.stale, a.caught, a.timeouts) == (
        b.steps, b.generated, b.stale, b.caught, b.timeouts)


def test_shipped_scenario_runs_small() -> None:
    scenario = replace(load("rl").with_overrides(nodes=24), duration_s=120.0,
                       sweep={"staleness": [0, 2]})
    report, _ = run_scenario(scenario)
    assert [(r["workers"], r["staleness"]) for r in report.results["runs"]] == [(24, 0), (24, 2)]
    assert report.invariants == {"no_honest_worker_excluded": True}
    assert {p.name for p in report.plots} == {"busy_vs_s", "stale_vs_s", "cost_vs_s"}
    assert report.headline["workers"] == 24 and "busy_s2" in report.headline


@pytest.mark.parametrize("seed", [1, 2])
def test_the_daemons_exploration_share_gives_untried_workers_picks(seed: int) -> None:
    # 200 workers, most of them never needed: picking the fastest idle one alone leaves the
    # rest untried (and cheaters among them unexposed); the selector's exploration share
    # (ExploringSelector, as in the daemon's rollout auction) tries more without costing steps
    from simulations.rl.run import RlWorld

    setup = replace(BASE, workers=200, staleness=4, cheater_share=0.2)
    greedy, exploring = RlWorld(replace(setup, explore_share=0.0), seed), RlWorld(setup, seed)
    a, b = greedy.run(), exploring.run()
    assert len(exploring.selector.tried) >= 2 * len(greedy.selector.tried), f"seed {seed}"
    assert exploring.selector.explored > 0 == greedy.selector.explored
    assert b.caught > a.caught and b.honest_excluded == 0, f"seed {seed}"
    assert b.steps >= a.steps and b.busy_fraction >= 0.9, f"seed {seed}"
