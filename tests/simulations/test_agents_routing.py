"""Agents with different skills: LinUCB learns to route to specialists that text matching
misses; with honest descriptions text matching alone routes right. Seeds print on failure."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from protocol.agents.matching import cosine
from simulations.agents import run_agents_scenario
from simulations.agents.population import AgentsConfig, build_population, make_tasks

KEYS = {
    "routing_accuracy_linucb", "routing_accuracy_score", "regret_linucb", "regret_score",
    "routing_accuracy_linucb_last", "routing_accuracy_score_last",
}
SEEDS = range(5)
TASKS = 400


def test_the_report_is_a_pure_function_of_the_seed() -> None:
    first = run_agents_scenario(7, TASKS)
    assert KEYS <= first.keys()
    assert run_agents_scenario(7, TASKS) == first
    assert run_agents_scenario(8, TASKS) != first
    assert all(0.0 <= first[k] <= 1.0 for k in KEYS if k.startswith("routing_accuracy"))
    assert first["regret_linucb"] >= 0.0 and first["regret_score"] >= 0.0


@pytest.mark.parametrize("seed", SEEDS)
def test_linucb_routes_better_than_score_in_the_last_quarter(seed: int) -> None:
    r = run_agents_scenario(seed, TASKS)
    assert r["routing_accuracy_linucb_last"] > r["routing_accuracy_score_last"], (seed, r)
    assert r["routing_accuracy_linucb_last"] >= 0.9, (seed, r)
    assert r["regret_linucb"] < r["regret_score"], (seed, r)


@pytest.mark.parametrize("seed", SEEDS)
def test_with_honest_descriptions_text_matching_alone_routes_right(seed: int) -> None:
    r = run_agents_scenario(seed, TASKS, specialist_claim=0.8, generalist_claim=0.3)
    assert r["routing_accuracy_score"] == 1.0, (seed, r)
    # LinUCB pays for exploring what the match already said
    assert r["regret_linucb"] > r["regret_score"], (seed, r)


def test_description_vectors_have_the_similarity_the_scenario_sets() -> None:
    cfg = AgentsConfig(claim_jitter=0.0)
    rng = random.Random(1)
    agents = build_population(cfg, rng)
    tasks = make_tasks(cfg, rng)
    assert len(agents) == cfg.skills * cfg.specialists_per_skill + cfg.generalists
    assert len({a.name for a in agents}) == len(agents)
    errors = []
    for task in tasks[:50]:
        for agent in agents:
            claimed = (cfg.generalist_claim if agent.kind == "generalist"
                       else cfg.specialist_claim if task.tags[0] in agent.skills else 0.0)
            errors.append(cosine(task.need_vector, agent.vector) - cfg.need_focus * claimed)
    # what is left is the dot product of the random residuals (unit directions in the 28
    # coordinates no skill uses, times their norms): zero on average, small each
    assert abs(sum(errors) / len(errors)) < 0.02
    assert max(abs(e) for e in errors) < 0.4


def test_a_config_that_cannot_be_built_is_refused() -> None:
    with pytest.raises(ValueError, match="generalist_claim"):
        run_agents_scenario(0, TASKS, generalist_claim=0.9)
    with pytest.raises(ValueError):
        run_agents_scenario(0, 2)
    with pytest.raises(TypeError):
        run_agents_scenario(0, TASKS, no_such_field=1)


def test_the_cli_prints_the_report_as_json() -> None:
    from node.cli.simulate import simulate

    out = CliRunner().invoke(simulate, ["agents", "--json", "--seed", "3"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report == run_agents_scenario(3)
    table = CliRunner().invoke(simulate, ["agents", "--seed", "3"])
    assert table.exit_code == 0 and "routing_accuracy_linucb_last" in table.output
