"""Routing tasks to agents: score-only selection against LinUCB, same seed, same tasks.

For each task, in order, every agent's card is matched to the task's need with
protocol.agents.matching.match_score (the daemon's rule), Symphony-Coord's screening
(protocol.agents.matching.screen: match as similarity, the requester's reputation of the agent
as prior, stability 1 as no agent churns here) keeps the ``top_l``, and the selector picks
one: protocol.market.selection.ScoreSelector (the fixed weighted score) or
protocol.market.linucb.LinUCBSelector (the bandit), the daemon's selectors over the same
``Candidate`` s. The chosen agent answers right iff the task's luck is below its quality on
the task's skill; the outcome (1 or 0) goes to the selector's ``observe`` and to the agent's
reputation (a Beta(1, 1) mean of its outcomes), as a requester's would after voting.

Reported per selector: ``routing_accuracy`` (share of tasks routed to an agent of the best
quality for the task's skill, a specialist), its value over the last quarter of the tasks
(``_last``: after learning), ``regret`` (cumulative expected regret: the best quality for each
task's skill minus the chosen agent's, summed over tasks) and ``success_rate``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from protocol.agents.matching import Screened, match_score, screen
from protocol.market.linucb import LinUCBSelector
from protocol.market.selection import Candidate, ScoreSelector, Selector
from simulations.agents.population import (
    AgentsConfig,
    SimAgent,
    SimTask,
    build_population,
    make_tasks,
)

#: every agent is always up here; churn would lower this (Symphony-Coord's stability term)
STABILITY = 1.0
#: price, latency and load are the same for every agent: only match and reputation differ
PRICE = 1.0
EST_LATENCY_MS = 1_000
DEADLINE_MS = 10_000


@dataclass(slots=True)
class Reputation:
    """A Beta(1, 1) mean of each agent's outcomes, as the requester has seen them."""

    wins: dict[str, int] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)

    def mean(self, agent: str) -> float:
        return (1 + self.wins.get(agent, 0)) / (2 + self.runs.get(agent, 0))

    def record(self, agent: str, success: bool) -> None:
        self.runs[agent] = self.runs.get(agent, 0) + 1
        self.wins[agent] = self.wins.get(agent, 0) + int(success)


@dataclass(frozen=True, slots=True)
class Routed:
    """One task's routing: whether it went to a best agent, its expected regret, its outcome."""

    right: bool
    regret: float
    success: bool


def candidates(task: SimTask, agents: list[SimAgent], reputation: Reputation,
               top_l: int) -> list[Candidate]:
    """The screened candidates for ``task``, as the selector sees them."""
    matches = {a.name: match_score(task.need_vector, task.tags, a.vector, a.skills)
               for a in agents}
    kept = screen([Screened(key=a.name, similarity=matches[a.name],
                            prior=reputation.mean(a.name), stability=STABILITY)
                   for a in agents], top_l)
    return [Candidate(peer=c.key, match_score=matches[c.key], reputation=c.prior, price=PRICE,
                      max_price=PRICE, est_latency_ms=EST_LATENCY_MS, deadline_ms=DEADLINE_MS,
                      load=0.0, free_slots=1)
            for c in kept]


def route(selector: Selector, agents: list[SimAgent], tasks: list[SimTask],
          top_l: int) -> list[Routed]:
    """Route every task in order through ``selector``, feeding outcomes back."""
    by_name = {a.name: a for a in agents}
    reputation = Reputation()
    out = []
    for task in tasks:
        task_id = task.index.to_bytes(8, "big")
        picked = selector.select(task_id, candidates(task, agents, reputation, top_l), 1)
        agent = by_name[picked[0].peer]
        quality = agent.quality[task.skill]
        best = max(a.quality[task.skill] for a in agents)
        success = task.luck < quality
        selector.observe(task_id, agent.name, 1.0 if success else 0.0)
        reputation.record(agent.name, success)
        out.append(Routed(right=quality >= best, regret=best - quality, success=success))
    return out


def summarize(name: str, routed: list[Routed]) -> dict[str, float]:
    last = routed[len(routed) - len(routed) // 4:]
    return {
        f"routing_accuracy_{name}": sum(r.right for r in routed) / len(routed),
        f"routing_accuracy_{name}_last": sum(r.right for r in last) / len(last),
        f"regret_{name}": round(sum(r.regret for r in routed), 9),
        f"success_rate_{name}": sum(r.success for r in routed) / len(routed),
    }


def run_agents_scenario(seed: int = 0, tasks: int = 800, **overrides: Any) -> dict[str, Any]:
    """Route one population's tasks by score-only selection and by LinUCB (the module
    docstring says what is measured); ``overrides`` are AgentsConfig fields."""
    cfg = replace(AgentsConfig(seed=seed, tasks=tasks), **overrides)
    cfg.check()
    rng = random.Random(seed)
    agents = build_population(cfg, rng)
    stream = make_tasks(cfg, rng)
    report: dict[str, Any] = {"seed": seed, "tasks": cfg.tasks, "agents": len(agents),
                              "skills": cfg.skills, "top_l": cfg.top_l}
    report.update(summarize("score", route(ScoreSelector(), agents, stream, cfg.top_l)))
    report.update(summarize("linucb", route(LinUCBSelector(), agents, stream, cfg.top_l)))
    return report
