"""Routing: the score selector vs the LinUCB selector, regret and success over time,
through a distribution shift and failing agents.

Two swarms with the same seed, the same executors and the same stream of tasks (k =
``[workload] k``, 1 by default) differ only in the requesters' selector (protocol.market.selection's
``ScoreSelector`` or protocol.market.linucb's ``LinUCBSelector``). When a task ends, the requester's
auction gets ``Reward(task, executor, 1 if the answer is right else 0)``, the delayed reward
a verifier or the asker would give (the simulator knows the truth; the protocol does not).

* At ``shift_s`` the executors' skills change (``shift``: "invert" maps skill s to
  1.15 - s, so the best become the worst), a distribution shift the selector must track.
* At ``fail_s`` the ``fail_share`` most skilled executors (after the shift) hang: they bid
  and accept, then never answer, so their attempts time out.

Per task: success (the answer is right) and expected regret: the best success probability
any live, non-hung executor offered for that question minus that of the executor chosen
(a failed task scores 0). Cumulative regret and rolling success are plotted against time.

``[workload]``: ``requesters`` (2), ``tasks_per_min`` (20), ``deadline_s`` (30), ``k`` (1),
``shift_s`` (1200), ``fail_s`` (2400), ``fail_share`` (0.15), ``executors`` classes.
``[sweep]``: ``selectors`` (["score", "linucb"]).
"""

from __future__ import annotations

from typing import Any

from protocol.market.events import AuctionConfig, Reward
from simulations.compute.cost import p_correct
from simulations.machines.market import AUCTION
from simulations.runner.report import Plot, Report, Series
from simulations.scenario import Scenario, workload_value
from simulations.workloads.common import Progress, Stages
from simulations.workloads.market import MarketWorld, build_market, conservation, schedule_tasks

QUESTION = (
    "Does a LinUCB bandit route tasks better than the fixed score, in regret and success "
    "over time, through a distribution shift and failing agents?"
)
ROLLING = 50


def _shift(world: MarketWorld) -> None:
    for i in world.executors:
        profile = world.swarm.nodes[i].profile
        profile.skill = {
            c: round(min(0.95, max(0.05, 1.15 - s)), 3) for c, s in profile.skill.items()
        }
    world.swarm.metrics.count("routing_shift")


def _fail(world: MarketWorld, share: float) -> None:
    def mean_skill(i: int) -> float:
        skill = world.swarm.nodes[i].profile.skill
        return float(sum(skill.values()) / len(skill))

    ranked = sorted(world.executors, key=lambda i: (-mean_skill(i), i))
    for i in ranked[: max(1, round(share * len(ranked)))]:
        world.swarm.nodes[i].profile.hung = True
    world.swarm.metrics.count("routing_failures_started")


def _one(scenario: Scenario, stages: Stages, selector: str) -> dict[str, Any]:
    n_req = int(workload_value(scenario, "requesters", 2))
    n_exec = max(4, scenario.nodes - n_req)
    duration_ms = int(scenario.duration_s * 1000)
    deadline_ms = int(float(workload_value(scenario, "deadline_s", 30.0)) * 1000)
    world = build_market(
        scenario,
        n_exec=n_exec,
        n_req=n_req,
        seed=scenario.seed,
        selector=selector,
        auction=AuctionConfig(reward_on_vote=False),
    )
    swarm = world.swarm
    tracker = _Outcomes(world)
    swarm.on_emit("task.done", tracker.on_end)
    swarm.on_emit("task.failed", tracker.on_end)
    schedule_tasks(
        world,
        start_ms=10_000,
        end_ms=duration_ms,
        per_min=float(workload_value(scenario, "tasks_per_min", 20.0)),
        k=int(workload_value(scenario, "k", 1)),
        deadline_ms=deadline_ms,
    )
    shift_ms = int(float(workload_value(scenario, "shift_s", 1200.0)) * 1000)
    fail_ms = int(float(workload_value(scenario, "fail_s", 2400.0)) * 1000)
    if 0 < shift_ms < duration_ms:
        swarm.at_ms(shift_ms, _shift, world)
    if 0 < fail_ms < duration_ms:
        swarm.at_ms(fail_ms, _fail, world, float(workload_value(scenario, "fail_share", 0.15)))
    end_ms = duration_ms + deadline_ms + 5_000
    stages.run(swarm, end_ms, f"routing {selector}")
    stages.next()
    row = _summary(selector, tracker.points, shift_ms, fail_ms, end_ms)
    row["_conservation"] = conservation(world)
    return row


class _Outcomes:
    """Rewards each ended task's executors by the truth and records, per task, its minute,
    its success and its expected regret (best live executor's success probability minus
    the chosen ones')."""

    def __init__(self, world: MarketWorld) -> None:
        self.world = world
        self.points: list[tuple[float, float, float]] = []  # (minute, success, regret)

    def on_end(self, node: Any, fields: dict[str, Any], now: int) -> None:
        world = self.world
        swarm = world.swarm
        rec = world.records.get(str(fields["task_id"]))
        if rec is None:
            return
        q = rec.question
        live = [
            swarm.nodes[i].profile
            for i in world.executors
            if swarm.nodes[i].up and not swarm.nodes[i].profile.hung
        ]
        best = max((p_correct(p.skill_for(q.category), q.difficulty) for p in live), default=0.0)
        chosen = 0.0
        success = 0.0
        if fields.get("answer") is not None:
            by_peer = world.by_peer
            probs = [
                p_correct(by_peer[p].profile.skill_for(q.category), q.difficulty)
                for p in rec.executors
                if p in by_peer
            ]
            chosen = sum(probs) / len(probs) if probs else 0.0
            right = rec.question.truth
            success = 1.0 if str(fields["answer"]) == right else 0.0
            for p in rec.executors:
                answer = _answer_of(world, node, rec.task_id, p)
                node.submit(
                    AUCTION, Reward(bytes.fromhex(rec.task_id), p, 1.0 if answer == right else 0.0)
                )
        self.points.append((now / 60_000, success, max(0.0, best - chosen)))


def _summary(
    selector: str,
    points: list[tuple[float, float, float]],
    shift_ms: int,
    fail_ms: int,
    end_ms: int,
) -> dict[str, Any]:
    points.sort()
    cum, total = [], 0.0
    for _, _, regret in points:
        total += regret
        cum.append(total)
    xs, roll = [], []
    for i in range(ROLLING, len(points) + 1, max(1, ROLLING // 5)):
        xs.append(points[i - 1][0])
        roll.append(sum(p[1] for p in points[i - ROLLING : i]) / ROLLING)

    def phase(lo: float, hi: float) -> float:
        sel = [p[1] for p in points if lo <= p[0] * 60_000 < hi]
        return sum(sel) / len(sel) if sel else 0.0

    return {
        "selector": selector,
        "tasks": len(points),
        "success": sum(p[1] for p in points) / max(1, len(points)),
        "success_before_shift": phase(0, shift_ms),
        "success_after_shift": phase(shift_ms, fail_ms),
        "success_after_failures": phase(fail_ms, end_ms),
        "cumulative_regret": total,
        "regret_per_task": total / max(1, len(points)),
        "_curve_regret": ([p[0] for p in points], cum),
        "_curve_success": (xs, roll),
    }


def _answer_of(world: MarketWorld, node: Any, task_id: str, peer: str) -> str | None:
    from protocol.answers import AnswerType, normalize_answer
    from simulations.machines.adversary import unwrap

    task = unwrap(node.machine(AUCTION)).tasks.get(bytes.fromhex(task_id))
    if task is None or peer not in task.results:
        return None
    return normalize_answer(AnswerType.NUMBER, task.results[peer].body.answer, ())


def run(scenario: Scenario, progress: Progress) -> Report:
    selectors = [str(s) for s in scenario.sweep.get("selectors", ["score", "linucb"])]
    stages = Stages(progress, [1.0] * len(selectors))
    rows = [_one(scenario, stages, s) for s in selectors]
    shift_min = float(workload_value(scenario, "shift_s", 1200.0)) / 60
    fail_min = float(workload_value(scenario, "fail_s", 2400.0)) / 60
    marks = f"shift at {shift_min:g} min, failures at {fail_min:g} min"
    plots = [
        Plot(
            "cumulative_regret",
            f"Cumulative expected regret ({marks})",
            "virtual minutes",
            "sum of (best available - chosen) success probability",
            series=[Series(r["selector"], *r["_curve_regret"]) for r in rows],
        ),
        Plot(
            "rolling_success",
            f"Task success, rolling {ROLLING} tasks ({marks})",
            "virtual minutes",
            "fraction answered correctly",
            series=[Series(r["selector"], *r["_curve_success"]) for r in rows],
        ),
    ]
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    headline: dict[str, Any] = {}
    for r in rows:
        headline[f"{r['selector']}_success"] = r["success"]
        headline[f"{r['selector']}_regret_per_task"] = r["regret_per_task"]
        headline[f"{r['selector']}_success_after_shift"] = r["success_after_shift"]
        headline[f"{r['selector']}_success_after_failures"] = r["success_after_failures"]
    checks = [r["_conservation"] for r in rows]
    return Report(
        scenario=scenario.as_dict(),
        question=QUESTION,
        headline=headline,
        results={"selectors": public},
        plots=plots,
        invariants={
            "every_task_ended_exactly_once": all(
                c["every_task_ended_exactly_once"] for c in checks
            ),
            "tasks_never_ended": sum(c["tasks_never_ended"] for c in checks),
        },
        notes=[
            "Rewards come from the simulator's ground truth (standing in for verification "
            "or the asker's feedback); reward_on_vote is off so k=1 votes do not reward "
            "every answer."
        ],
    )
