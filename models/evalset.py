"""The shipped evaluation set: short arithmetic and multiple-choice questions, and an evaluator.

``generate_evalset(seed=EVALSET_SEED)`` is deterministic (its own ``random.Random``); its output
is stored as ``models/data/evalset.jsonl`` (regenerate with ``python -m models.evalset``; a test
checks the file matches). Questions are single-step on purpose, so a 135M model scores above
chance but well below perfect.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from models.backend import Backend
from models.cot import Problem, solve
from protocol.answers import AnswerType, normalize_answer

EVALSET_SEED = 20240601
EVALSET_SIZE = 100
EVALSET_PATH = Path(__file__).parent / "data" / "evalset.jsonl"

_NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun"]
_THINGS = ["apples", "books", "coins", "pencils", "stamps", "marbles", "cards", "shells"]
_CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
             ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Russia", "Moscow")]
_OPPOSITES = [("hot", "cold"), ("up", "down"), ("big", "small"), ("fast", "slow"),
              ("day", "night"), ("open", "closed"), ("full", "empty"), ("wet", "dry")]
_ANIMALS = [("cow", "moo"), ("dog", "bark"), ("cat", "meow"), ("duck", "quack"), ("lion", "roar")]


@dataclass(frozen=True, slots=True)
class EvalItem:
    id: str
    problem: Problem
    answer: str  # the expected answer, already normalized


def _arith(rng: random.Random, i: int) -> EvalItem:
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    kind = rng.randrange(4)
    a, b = rng.randint(2, 20), rng.randint(2, 9)
    if kind == 0:
        q, ans = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
    elif kind == 1:
        a = a + b
        q, ans = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?", a - b
    elif kind == 2:
        q, ans = f"What is {a} times {b}?", a * b
    else:
        q, ans = f"What is {a} plus {b}?", a + b
    return EvalItem(f"arith-{i:03d}", Problem(q, AnswerType.NUMBER), str(ans))


def _choice(rng: random.Random, i: int) -> EvalItem:
    kind = rng.randrange(3)
    pool: list[tuple[str, str]]
    if kind == 0:
        pool, template = _CAPITALS, "What is the capital of {}?"
    elif kind == 1:
        pool, template = _OPPOSITES, "What is the opposite of '{}'?"
    else:
        pool, template = _ANIMALS, "What sound does a {} make?"
    key, right = rng.choice(pool)
    wrong = rng.sample([v for _, v in pool if v != right], 3)
    options = wrong + [right]
    rng.shuffle(options)
    letter = chr(ord("A") + options.index(right))
    return EvalItem(f"choice-{i:03d}", Problem(template.format(key), AnswerType.CHOICE,
                                               tuple(options)), letter)


def generate_evalset(seed: int = EVALSET_SEED, n: int = EVALSET_SIZE) -> list[EvalItem]:
    """n items, alternating arithmetic (NUMBER) and multiple choice (CHOICE); deterministic."""
    rng = random.Random(seed)
    return [(_arith if i % 2 == 0 else _choice)(rng, i) for i in range(n)]


def to_jsonl(items: Iterable[EvalItem]) -> str:
    return "".join(json.dumps({"id": it.id, "question": it.problem.question,
                               "answer_type": it.problem.answer_type.value,
                               "choices": list(it.problem.choices), "answer": it.answer},
                              sort_keys=True) + "\n" for it in items)


def load_evalset(path: Path = EVALSET_PATH) -> list[EvalItem]:
    items = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        problem = Problem(row["question"], AnswerType(row["answer_type"]), tuple(row["choices"]))
        items.append(EvalItem(row["id"], problem, row["answer"]))
    return items


@dataclass(frozen=True, slots=True)
class EvalReport:
    accuracy: float  # correct / total
    correct: int
    total: int
    unparsed: int  # answers that did not normalize
    mean_confidence: float
    tokens: int  # generated tokens in all


def evaluate(backend: Backend, items: Iterable[EvalItem], *, cot: bool = True,
             max_tokens: int | None = None, seed: int = 0) -> EvalReport:
    """Solve every item greedily and count exact matches of the normalized answers."""
    correct = unparsed = total = tokens = 0
    conf = 0.0
    for it in items:
        sol = solve(backend, it.problem, cot=cot, seed=seed, max_tokens=max_tokens)
        total += 1
        tokens += len(sol.token_ids)
        conf += sol.confidence
        expected = normalize_answer(it.problem.answer_type, it.answer, it.problem.choices)
        if sol.normalized is None:
            unparsed += 1
        elif sol.normalized == expected:
            correct += 1
    return EvalReport(correct / max(total, 1), correct, total, unparsed, conf / max(total, 1), tokens)


if __name__ == "__main__":
    EVALSET_PATH.parent.mkdir(parents=True, exist_ok=True)
    EVALSET_PATH.write_text(to_jsonl(generate_evalset()))
    print(f"wrote {EVALSET_PATH}")
