"""The figures of `symphony bench agents` from its asks' outcomes (pure: no network, no model).

Each mode (``single``: one generalist, ``vote``: a k = 3 vote, ``plan``: plan mode) yields one
:class:`Outcome` per question asked: whether its final answer equals the question's exact
answer (an ask that failed or timed out counts as wrong) and its time from ask to answer.
Accuracies come with the Wilson 95% interval over the questions (models/stats.py), as
``accuracy_<mode>_ci95 = [low, high]``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from models.stats import wilson_interval

MODES = ("single", "vote", "plan")


@dataclass(frozen=True, slots=True)
class Outcome:
    correct: bool
    seconds: float
    #: the ask finished (phase "done"); a failed ask is still counted, as wrong
    done: bool = True


@dataclass(frozen=True, slots=True)
class PlanCounts:
    """What the plan-mode asks did, summed over its questions."""

    #: steps given to more than one executor (the snapshot's ``steps_rerouted``)
    steps_rerouted: int = 0
    #: planners' results that parsed into a plan, and those that did not
    plans_valid: int = 0
    plans_invalid: int = 0
    #: steps of the plans that answered, and how many a calculator agent ran
    steps: int = 0
    steps_by_calculator: int = 0
    #: plans (in the final snapshots) that had steps
    plans_with_steps: int = 0


def _rounded(low_high: tuple[float, float]) -> list[float]:
    return [round(low_high[0], 4), round(low_high[1], 4)]


def assemble(questions: int, outcomes: Mapping[str, Sequence[Outcome]],
             counts: PlanCounts) -> dict[str, object]:
    """The bench's figures. ``outcomes`` holds one list per mode in :data:`MODES`, each with
    one outcome per question (``ValueError`` otherwise: the modes must see the same
    questions)."""
    if questions < 1:
        raise ValueError("the bench needs at least one question")
    if sorted(outcomes) != sorted(MODES):
        raise ValueError(f"outcomes for modes {sorted(outcomes)}, expected {sorted(MODES)}")
    figures: dict[str, object] = {"questions": questions}
    for mode in MODES:
        rows = outcomes[mode]
        if len(rows) != questions:
            raise ValueError(f"{mode}: {len(rows)} outcomes for {questions} questions")
        right = sum(o.correct for o in rows)
        figures[f"accuracy_{mode}"] = round(right / questions, 4)
        figures[f"accuracy_{mode}_ci95"] = _rounded(wilson_interval(right, questions))
        figures[f"done_{mode}"] = sum(o.done for o in rows)
    for mode in MODES:
        figures[f"latency_{mode}_s"] = round(statistics.median(
            o.seconds for o in outcomes[mode]), 2)
    parsed = counts.plans_valid + counts.plans_invalid
    figures["plans_valid_fraction"] = round(counts.plans_valid / parsed, 4) if parsed else 0.0
    figures["plans_valid"], figures["plans_invalid"] = counts.plans_valid, counts.plans_invalid
    figures["steps_rerouted"] = counts.steps_rerouted
    figures["steps_per_plan"] = round(counts.steps / counts.plans_with_steps, 2) \
        if counts.plans_with_steps else 0.0
    figures["steps_by_calculator"] = counts.steps_by_calculator
    return figures


def plan_counts(snapshots: Sequence[dict[str, object]], calculator: str) -> PlanCounts:
    """Steps rerouted, steps run and steps the agent named ``calculator`` ran, over the plan
    tasks' snapshots (``GET /tasks/{id}``); the plan validity counts come from the asker's
    pipeline counters (bench.py), so they stay 0 here."""
    rerouted = steps = by_calc = with_steps = 0
    for snap in snapshots:
        rerouted += int(snap.get("steps_rerouted", 0))  # type: ignore[call-overload]
        for plan in snap.get("plans", []):  # type: ignore[attr-defined]
            with_steps += bool(plan.get("steps"))
            for step in plan.get("steps", []):
                steps += 1
                by_calc += step.get("agent") == calculator
    return PlanCounts(steps_rerouted=rerouted, steps=steps, steps_by_calculator=by_calc,
                      plans_with_steps=with_steps)
