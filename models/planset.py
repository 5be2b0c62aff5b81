"""The shipped multi-step questions: arithmetic word problems of 2 or 3 steps, exact answers.

Plan mode (a planner splits a task into steps, each routed to the agent that fits it best) is
measured on these: a single step of a small model rarely gets them right, a plan whose
arithmetic steps go to a calculator agent should. ``generate_planset(seed=PLANSET_SEED)`` is
deterministic (its own ``random.Random``); its output is stored as
``models/data/planset.jsonl`` (regenerate with ``python -m models.planset``), in the format of
the evaluation set (models/evalset.py: read it with ``load_evalset(PLANSET_PATH)``), ids
``plan-000`` on, plus each item's ``expression``: the arithmetic its answer is, with the
question's numbers (``+``, ``-``, ``*`` and exact ``//``). Each answer is computed here from the
template's numbers, and a test recomputes it from the stored expression.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from models.cot import Problem
from models.evalset import EvalItem
from protocol.answers import AnswerType

PLANSET_SEED = 20261127
PLANSET_SIZE = 48
PLANSET_PATH = Path(__file__).parent / "data" / "planset.jsonl"

_NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun"]
_THINGS = ["apples", "books", "coins", "pencils", "stamps", "marbles", "cards", "shells"]


@dataclass(frozen=True, slots=True)
class PlanItem:
    item: EvalItem
    #: the answer as arithmetic over the question's numbers
    expression: str


_Made = tuple[str, str, int]  # question, expression, answer


def _boxes_given(rng: random.Random, n: str, t: str) -> _Made:
    a, b = rng.randint(3, 12), rng.randint(4, 12)
    c = rng.randint(2, a * b - 1)
    return (f"{n} has {a} boxes of {t} with {b} {t} in each box, and gives away {c} {t}. "
            f"How many {t} does {n} have left?", f"{a} * {b} - {c}", a * b - c)


def _two_packs(rng: random.Random, n: str, t: str) -> _Made:
    a, b, c, d = rng.randint(2, 9), rng.randint(3, 15), rng.randint(2, 9), rng.randint(3, 15)
    return (f"{n} buys {a} packs of {b} {t} and {c} packs of {d} {t}. "
            f"How many {t} does {n} buy in all?", f"{a} * {b} + {c} * {d}", a * b + c * d)


def _share(rng: random.Random, n: str, t: str) -> _Made:
    c, each = rng.randint(2, 9), rng.randint(3, 20)
    total = c * each
    a = rng.randint(1, total - 1)
    b = total - a
    return (f"{n} has {a} {t} and gets {b} more, then shares all of them equally among "
            f"{c} friends. How many {t} does each friend get?", f"({a} + {b}) // {c}", total // c)


def _shop(rng: random.Random, n: str, t: str) -> _Made:
    a = rng.randint(40, 120)
    b, c = rng.randint(5, a // 3), rng.randint(5, a // 3)
    d = rng.randint(5, 50)
    return (f"{n}'s shop has {a} {t}. It sells {b} {t} on Monday and {c} {t} on Tuesday, "
            f"then receives a delivery of {d} {t}. How many {t} does the shop have now?",
            f"{a} - {b} - {c} + {d}", a - b - c + d)


def _wages(rng: random.Random, n: str, t: str) -> _Made:
    a, b = rng.randint(5, 25), rng.randint(3, 14)
    c = rng.randint(1, a * b - 1)
    return (f"{n} earns {a} coins a day for {b} days and then spends {c} coins. "
            f"How many coins does {n} have left?", f"{a} * {b} - {c}", a * b - c)


def _times_as_many(rng: random.Random, n: str, t: str) -> _Made:
    m = rng.choice([x for x in _NAMES if x != n])
    a, b = rng.randint(3, 30), rng.randint(2, 6)
    return (f"{n} has {a} {t}. {m} has {b} times as many {t} as {n}. "
            f"How many {t} do {n} and {m} have together?", f"{a} + {a} * {b}", a + a * b)


def _rooms(rng: random.Random, n: str, t: str) -> _Made:
    a, b, d = rng.randint(4, 12), rng.randint(5, 12), rng.randint(2, 6)
    c = (a * b) % d + d * rng.randint(0, 2) or d  # what is left splits exactly, c >= 1
    return (f"A hall has {a} rows of {b} chairs. {c} chairs are taken away and the rest are "
            f"split equally among {d} rooms. How many chairs does each room get?",
            f"({a} * {b} - {c}) // {d}", (a * b - c) // d)


def _reading(rng: random.Random, n: str, t: str) -> _Made:
    a, b, c, d = rng.randint(5, 30), rng.randint(2, 7), rng.randint(5, 30), rng.randint(2, 7)
    return (f"{n} reads {a} pages a day for {b} days, then {c} pages a day for {d} days. "
            f"How many pages does {n} read in all?", f"{a} * {b} + {c} * {d}", a * b + c * d)


_TEMPLATES: list[Callable[[random.Random, str, str], _Made]] = [
    _boxes_given, _two_packs, _share, _shop, _wages, _times_as_many, _rooms, _reading]


def generate_planset(seed: int = PLANSET_SEED, n: int = PLANSET_SIZE) -> list[PlanItem]:
    """n multi-step NUMBER items, cycling through the templates; deterministic."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
        question, expression, answer = _TEMPLATES[i % len(_TEMPLATES)](rng, name, thing)
        item = EvalItem(f"plan-{i:03d}", Problem(question, AnswerType.NUMBER), str(answer))
        items.append(PlanItem(item, expression))
    return items


def to_jsonl(items: Iterable[PlanItem]) -> str:
    """The evaluation set's JSON lines, plus each item's expression."""
    return "".join(json.dumps({"id": p.item.id, "question": p.item.problem.question,
                               "answer_type": p.item.problem.answer_type.value,
                               "choices": list(p.item.problem.choices), "answer": p.item.answer,
                               "expression": p.expression}, sort_keys=True) + "\n"
                   for p in items)


def load_expressions(path: Path = PLANSET_PATH) -> dict[str, str]:
    """Each stored item's expression by id (the items themselves: ``load_evalset(path)``)."""
    rows = (json.loads(line) for line in path.read_text().splitlines())
    return {row["id"]: row["expression"] for row in rows}


if __name__ == "__main__":
    PLANSET_PATH.write_text(to_jsonl(generate_planset()))
    print(f"wrote {PLANSET_PATH}")
