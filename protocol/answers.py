"""Answer types and answer normalization (pure: stdlib only, no I/O, no clock, no randomness).

A task names an :class:`AnswerType`; executors return a raw answer string; voting compares
answers only after :func:`normalize_answer` has mapped each to a canonical string, so "42",
"42.0", "$42" and "**42**." are one vote. The same function runs on the executor (models/) and
on every peer that counts votes (protocol/), so it must be deterministic and total: any input
string gives either a canonical string or ``None`` ("unparseable"), never an exception.

Canonical forms:
- ``TEXT``:   casefolded, whitespace collapsed, wrapping markdown/quotes and trailing
              punctuation removed.
- ``CHOICE``: the option letter, "A" for ``choices[0]``, "B" for ``choices[1]``...; accepts a
              letter ("b", "(B)", "B)", "Option B", "**B**") or the exact text of one choice.
              With no choices given, any single letter A-Z is accepted.
- ``NUMBER``: the (last) number in the string as a reduced decimal ("3.50" -> "3.5",
              "1,000" -> "1000", "-0" -> "0"); a fraction "3/4" becomes "0.75", or stays "p/q"
              reduced when its decimal expansion does not terminate.
- ``EXACT``:  the string with surrounding whitespace and one wrapping layer of markdown
              emphasis / backticks / quotes removed; otherwise byte-for-byte.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation
from enum import Enum
from fractions import Fraction

#: Longest raw answer we look at; anything longer is unparseable (bounds work on peer data).
MAX_RAW_CHARS = 4096
#: Most digits a number may have (bounds Decimal/Fraction work on peer data).
MAX_NUMBER_DIGITS = 64
#: Most choices a multiple-choice task may have (letters A..Z).
MAX_CHOICES = 26


class AnswerType(str, Enum):
    TEXT = "text"  # free text, compared loosely
    CHOICE = "choice"  # multiple choice, compared by option letter
    NUMBER = "number"  # a number, compared by value
    EXACT = "exact"  # an exact string, compared strictly


_WRAP_PAIRS = (("**", "**"), ("__", "__"), ("`", "`"), ("*", "*"), ("_", "_"), ('"', '"'),
               ("'", "'"), ("\u201c", "\u201d"), ("$", "$"))
_TRAILING_PUNCT = ".,;:!?\u3002"
_NUMBER_RE = re.compile(
    r"(?<![\w.])[-\u2212+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:\s*/\s*\d+)?(?![\w])"
)
_LETTER_RE = re.compile(
    r"^(?:(?:the\s+)?(?:option|choice|answer)(?:\s+is)?[\s:]*)?"
    r"[\(\[]?([a-z])(?:(?:[\)\]][.:]?|[.:])(?:\s*(.*))?)?$",
    re.IGNORECASE,
)


def _unwrap(s: str) -> str:
    """Strip surrounding whitespace and wrapping markdown / quote pairs, repeatedly."""
    s = s.strip()
    changed = True
    while changed and s:
        changed = False
        for left, right in _WRAP_PAIRS:
            if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left):len(s) - len(right)].strip()
                changed = True
                break
    return s


def _loose(s: str) -> str:
    """Loose form for TEXT and choice-text matching: NFKC, casefold, no wrapping/punct."""
    s = unicodedata.normalize("NFKC", s)
    s = " ".join(s.split())
    s = _unwrap(s)
    s = s.rstrip(_TRAILING_PUNCT).rstrip()
    s = _unwrap(s)
    return s.casefold()


def _normalize_text(raw: str) -> str | None:
    s = _loose(raw)
    return s or None


def _normalize_exact(raw: str) -> str | None:
    s = raw.strip()
    for left, right in _WRAP_PAIRS:
        if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
            s = s[len(left):len(s) - len(right)].strip()
            break
    return s or None


def _format_fraction(value: Fraction) -> str | None:
    if value == 0:
        return "0"
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:  # non-terminating decimal: keep the reduced fraction
        return f"{value.numerator}/{value.denominator}"
    d = Decimal(value.numerator) / Decimal(value.denominator)
    text = format(d.normalize(), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _parse_number(token: str) -> Fraction | None:
    token = token.replace("\u2212", "-").replace(",", "").replace(" ", "")
    if sum(c.isdigit() for c in token) > MAX_NUMBER_DIGITS:
        return None
    try:
        if "/" in token:
            num, den = token.split("/", 1)
            d = int(den)
            if d == 0:
                return None
            return Fraction(Decimal(num)) / d
        return Fraction(Decimal(token))
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None


def _normalize_number(raw: str) -> str | None:
    s = unicodedata.normalize("NFKC", raw)
    candidates = [m.group(0) for m in _NUMBER_RE.finditer(s) if any(c.isdigit() for c in m.group(0))]
    if not candidates:
        return None
    value = _parse_number(candidates[-1].strip())
    if value is None:
        return None
    return _format_fraction(value)


def _normalize_choice(raw: str, choices: tuple[str, ...]) -> str | None:
    if len(choices) > MAX_CHOICES:
        return None
    n = len(choices) if choices else MAX_CHOICES
    s = _loose(raw)
    if not s:
        return None
    # The exact text of one choice ("paris"), or "b) paris" / "b. paris" matching choice B.
    loose_choices = [_loose(c) for c in choices]
    if s in loose_choices and loose_choices.count(s) == 1:
        return chr(ord("A") + loose_choices.index(s))
    m = _LETTER_RE.match(s)
    if m is None:
        return None
    index = ord(m.group(1).lower()) - ord("a")
    if index >= n:
        return None
    rest = _loose(m.group(2) or "")
    if rest and rest in loose_choices and rest != loose_choices[index]:
        return None  # "B) London" while B is "Paris" and A is "London": refuse to guess
    return chr(ord("A") + index)


def normalize_answer(answer_type: AnswerType, raw: str, choices: tuple[str, ...] = ()) -> str | None:
    """Canonical form of ``raw`` for ``answer_type``; ``None`` when it cannot be parsed.

    Total and deterministic: never raises on any ``raw`` string (the type and choices are
    trusted, they come from the task), and the same inputs give the same output everywhere.
    """
    if not isinstance(raw, str) or len(raw) > MAX_RAW_CHARS:
        return None
    if answer_type is AnswerType.TEXT:
        return _normalize_text(raw)
    if answer_type is AnswerType.EXACT:
        return _normalize_exact(raw)
    if answer_type is AnswerType.NUMBER:
        return _normalize_number(raw)
    if answer_type is AnswerType.CHOICE:
        return _normalize_choice(raw, choices)
    return None
