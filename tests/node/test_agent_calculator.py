"""The calculator tool: exact results, and nothing but arithmetic (node/agents/calculator.py)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import trio

from node.agents.calculator import (
    MAX_DEPTH,
    MAX_EXPRESSION_CHARS,
    Calculator,
    CalculatorError,
    evaluate,
    format_value,
)
from node.agents.tools import ToolFailed


@pytest.mark.parametrize("expression, expected", [
    ("1234 * 5678", "7006652"),
    ("0.1 + 0.2", "0.3"),
    ("1/3", "1/3 (≈ 0.33333333333333333333)"),
    ("-2 ** 2", "-4"),
    ("(-2) ** 2", "4"),
    ("2 ** 3 ** 2", "512"),
    ("2 ^ 10", "1024"),
    ("2 ** -2", "0.25"),
    ("--3", "3"),
    ("+.5 * 4", "2"),
    ("7 / 2 - 3.5", "0"),
    ("(1 + 2) * (3 - 4) / 6", "-0.5"),
    ("-1.25", "-1.25"),
    ("0.001 * 3", "0.003"),
    ("99999999999999999999 * 99999999999999999999",
     "9999999999999999999800000000000000000001"),
])
def test_exact_results(expression: str, expected: str) -> None:
    assert format_value(evaluate(expression)) == expected


def test_decimals_are_exact() -> None:
    assert evaluate("0.1") == Fraction(1, 10)


@pytest.mark.parametrize("expression, match", [
    ("__import__('os').system('true')", "unexpected character '_'"),
    ("a.b", "unexpected character 'a'"),
    ("abs(-1)", "unexpected character 'a'"),
    ("2 if 1 else 3", "unexpected character 'i'"),
    ("[1][0]", "unexpected character '\\['"),
    ("1 < 2", "unexpected character '<'"),
    ("0x10", "unexpected character 'x'"),
    ("1e5", "unexpected character 'e'"),
    ("lambda: 1", "unexpected character 'l'"),
    ("1; 2", "unexpected character ';'"),
    ("1 // 2", "expected a number or '\\('"),
    ("1 2", "unexpected '2'"),
    ("1 +", "the end of the expression"),
    ("(1 + 2", "missing '\\)'"),
    ("1.2.3", "malformed number"),
    ("1 / 0", "division by zero"),
    ("1 / (2 - 2)", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("2 ** 0.5", "not an integer"),
    ("2 ** 1001", "larger than 1000"),
    ("3 ** 1000 * 3 ** 1000 * 3 ** 1000", "larger than 4096 bits"),
    ("1" * (MAX_EXPRESSION_CHARS + 1), "more than 200"),
    ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "deeper than"),
    ("-" * (MAX_DEPTH + 1) + "1", "deeper than"),
    ("", "the end of the expression"),
    ("١٢", "unexpected character"),
])
def test_refused(expression: str, match: str) -> None:
    with pytest.raises(CalculatorError, match=match):
        evaluate(expression)


def test_tool_reports_errors_as_tool_failures() -> None:
    calc = Calculator()
    assert trio.run(calc.run, {"expression": "6 * 7"}) == "42"
    with pytest.raises(ToolFailed, match="calculator: division by zero"):
        trio.run(calc.run, {"expression": "1/0"})
    assert calc.spec.side_effects is False
