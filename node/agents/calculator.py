"""The built-in ``calculator`` tool: exact arithmetic on numbers, parsed here, never evaluated
by Python.

Grammar (a recursive-descent parser over our own tokens; Python's ``eval``, ``compile`` and
``ast`` are never used, so no name, attribute, call or other construct can mean anything)::

    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := ("-" | "+") unary | power
    power  := atom (("**" | "^") unary)?        right-associative, binds tighter than unary
    atom   := NUMBER | "(" expr ")"
    NUMBER := digits ["." digits] | "." digits

Numbers are exact (``fractions.Fraction``, decimals read as written). Bounds, each a named
constant and a :class:`CalculatorError` when passed: the expression's length, the nesting
depth, the exponent (an integer of at most ``MAX_EXPONENT``), and the size of every
intermediate result (``MAX_RESULT_BITS`` for numerator and denominator), checked before a
power is computed so no input makes it run long or take much memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from node.agents.tools import ToolFailed, ToolSpec

MAX_EXPRESSION_CHARS = 200
#: parentheses and unary signs nested this deep at most
MAX_DEPTH = 40
#: absolute value of an exponent
MAX_EXPONENT = 1000
#: bits of the numerator and of the denominator of any intermediate result
MAX_RESULT_BITS = 4096
#: digits after the point when a fraction that has no finite decimal form is shown
APPROX_DIGITS = 20

_OPERATORS = ("**", "+", "-", "*", "/", "^", "(", ")")


class CalculatorError(ValueError):
    """The expression is malformed, out of bounds, or divides by zero; the message says which."""


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "num" or an operator from _OPERATORS, or "end"
    text: str
    at: int  # position in the expression


def _tokenize(expression: str) -> list[_Token]:
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression has {len(expression)} characters, more than "
                              f"{MAX_EXPRESSION_CHARS}")
    tokens: list[_Token] = []
    i = 0
    while i < len(expression):
        ch = expression[i]
        if ch in " \t":
            i += 1
        elif ch.isascii() and (ch.isdigit() or ch == "."):
            j = i
            while j < len(expression) and expression[j].isascii() and expression[j].isdigit():
                j += 1
            if j < len(expression) and expression[j] == ".":
                j += 1
                while j < len(expression) and expression[j].isascii() and \
                        expression[j].isdigit():
                    j += 1
            text = expression[i:j]
            if text == "." or (j < len(expression) and expression[j] == "."):
                raise CalculatorError(f"malformed number at position {i}")
            tokens.append(_Token("num", text, i))
            i = j
        else:
            op = next((o for o in _OPERATORS if expression.startswith(o, i)), None)
            if op is None:
                raise CalculatorError(f"unexpected character {ch!r} at position {i}: only "
                                      "numbers, + - * / ** ^ and parentheses are allowed")
            tokens.append(_Token(op, op, i))
            i += len(op)
    tokens.append(_Token("end", "", len(expression)))
    return tokens


def _bounded(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > MAX_RESULT_BITS or \
            value.denominator.bit_length() > MAX_RESULT_BITS:
        raise CalculatorError(f"a result is larger than {MAX_RESULT_BITS} bits")
    return value


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def nested(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalculatorError(f"the expression nests deeper than {MAX_DEPTH} levels")

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek().kind in ("+", "-"):
            op = self.take().kind
            right = self.term()
            value = _bounded(value + right if op == "+" else value - right)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek().kind in ("*", "/"):
            op = self.take()
            right = self.unary()
            if op.kind == "/" and right == 0:
                raise CalculatorError(f"division by zero at position {op.at}")
            value = _bounded(value * right if op.kind == "*" else value / right)
        return value

    def unary(self) -> Fraction:
        if self.peek().kind in ("+", "-"):
            sign = self.take().kind
            self.nested()
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek().kind not in ("**", "^"):
            return base
        op = self.take()
        self.nested()
        exponent = self.unary()
        self.depth -= 1
        return _power(base, exponent, op.at)

    def atom(self) -> Fraction:
        token = self.take()
        if token.kind == "num":
            return _bounded(Fraction(Decimal(token.text)))
        if token.kind == "(":
            self.nested()
            value = self.expr()
            self.depth -= 1
            if self.take().kind != ")":
                raise CalculatorError(f"missing ')' for the '(' at position {token.at}")
            return value
        what = "the end of the expression" if token.kind == "end" else repr(token.text)
        raise CalculatorError(f"expected a number or '(' at position {token.at}, got {what}")


def _power(base: Fraction, exponent: Fraction, at: int) -> Fraction:
    if exponent.denominator != 1:
        raise CalculatorError(f"the exponent at position {at} is not an integer, so the result "
                              "would not be exact")
    n = exponent.numerator
    if abs(n) > MAX_EXPONENT:
        raise CalculatorError(f"the exponent {n} is larger than {MAX_EXPONENT}")
    if base == 0 and n < 0:
        raise CalculatorError(f"division by zero: 0 to a negative power at position {at}")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if (bits - 1) * abs(n) > MAX_RESULT_BITS:
        raise CalculatorError(f"a result is larger than {MAX_RESULT_BITS} bits")
    return _bounded(base ** n)


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``; raises :class:`CalculatorError`."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be a string")
    parser = _Parser(_tokenize(expression))
    value = parser.expr()
    tail = parser.peek()
    if tail.kind != "end":
        raise CalculatorError(f"unexpected {tail.text!r} at position {tail.at}")
    return value


def format_value(value: Fraction) -> str:
    """An integer as digits; a fraction with a finite decimal form as that decimal; any other
    fraction as ``p/q (≈ decimal)``."""
    if value.denominator == 1:
        return str(value.numerator)
    d, places = value.denominator, 0
    for prime in (2, 5):
        count = 0
        while d % prime == 0:
            d //= prime
            count += 1
        places = max(places, count)
    if d == 1:
        scaled = value.numerator * 10 ** places // value.denominator
        sign = "-" if scaled < 0 else ""
        digits = str(abs(scaled)).rjust(places + 1, "0")
        return f"{sign}{digits[:-places]}.{digits[-places:]}"
    approx = round(value, APPROX_DIGITS)
    return f"{value.numerator}/{value.denominator} (≈ {format_value(approx)})"


class Calculator:
    """The ``calculator`` tool (read-only, pure)."""

    spec = ToolSpec(
        name="calculator",
        description="Exact arithmetic: + - * / ** and parentheses on integers and decimals.",
        parameters={"type": "object",
                    "properties": {"expression": {"type": "string",
                                                  "maxLength": MAX_EXPRESSION_CHARS}},
                    "required": ["expression"], "additionalProperties": False},
        side_effects=False,
    )

    async def prepare(self) -> None:
        return None

    async def run(self, arguments: dict[str, Any]) -> str:
        try:
            return format_value(evaluate(arguments["expression"]))
        except CalculatorError as exc:
            raise ToolFailed(f"calculator: {exc}") from None
