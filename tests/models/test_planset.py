"""The shipped multi-step questions: the file is the generator's output, every answer is
recomputed here from its stored expression, and every item takes 2 or 3 steps."""

from __future__ import annotations

import ast
import re

import pytest

from models.evalset import load_evalset
from models.planset import PLANSET_PATH, generate_planset, load_expressions, to_jsonl
from protocol.answers import AnswerType, normalize_answer

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b}


def evaluate(node: ast.AST) -> int:
    """Integer arithmetic over + - * and exact //; anything else is refused."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp):
        a, b = evaluate(node.left), evaluate(node.right)
        if isinstance(node.op, ast.FloorDiv):
            assert b != 0 and a % b == 0, f"{a} // {b} is not exact"
            return a // b
        if type(node.op) in _OPS:
            return _OPS[type(node.op)](a, b)
    raise AssertionError(f"not plain arithmetic: {ast.dump(node)}")


def steps(expression: str) -> int:
    return sum(isinstance(n, ast.BinOp) for n in ast.walk(ast.parse(expression, mode="eval")))


ITEMS = load_evalset(PLANSET_PATH)
EXPRESSIONS = load_expressions()


def test_shipped_file_is_the_generator_output() -> None:
    generated = generate_planset()
    assert PLANSET_PATH.read_text() == to_jsonl(generated)
    assert ITEMS == [p.item for p in generated]
    assert len(ITEMS) >= 40
    assert [it.id for it in ITEMS] == [f"plan-{i:03d}" for i in range(len(ITEMS))]


@pytest.mark.parametrize("item", ITEMS, ids=lambda it: it.id)
def test_answer_is_recomputed_from_the_stored_expression(item) -> None:  # type: ignore[no-untyped-def]
    expression = EXPRESSIONS[item.id]
    answer = evaluate(ast.parse(expression, mode="eval"))
    assert answer >= 0 and item.answer == str(answer)
    assert item.problem.answer_type is AnswerType.NUMBER and item.problem.choices == ()
    assert normalize_answer(AnswerType.NUMBER, item.answer, ()) == item.answer
    assert steps(expression) in (2, 3), "each question takes 2 or 3 steps of arithmetic"
    # the expression is over the question's own numbers, and uses each of them
    in_question = set(re.findall(r"\d+", item.problem.question))
    assert set(re.findall(r"\d+", expression)) == in_question


def test_the_checker_refuses_what_it_should() -> None:
    with pytest.raises(AssertionError, match="not exact"):
        evaluate(ast.parse("7 // 2", mode="eval"))
    with pytest.raises(AssertionError, match="not plain arithmetic"):
        evaluate(ast.parse("2 ** 3", mode="eval"))
    assert evaluate(ast.parse("(11 * 8 - 4) // 6", mode="eval")) == 14
    assert steps("(11 * 8 - 4) // 6") == 3 and steps("25 + 25 * 2") == 2
