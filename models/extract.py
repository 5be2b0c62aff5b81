"""Pull the final answer out of a chain of thought, and score it from token logprobs.

The executor prompt asks the model to end with a line ``Final answer: <answer>``; models do
not always obey, so :func:`extract_answer` tries, in order, and takes the *last* match of the
first rule that matches anything:

1. ``final answer: X`` (markdown emphasis around "final answer" allowed);
2. ``\\boxed{X}``;
3. ``#### X`` (GSM8K style);
4. ``answer: X`` / ``the answer is X`` / ``answer is X``;
5. fallback by answer type: the last number (NUMBER); for CHOICE the single option the text
   mentions, by letter (``(B)``, ``B)``, ``B.``) or by its text, and nothing when it mentions
   several (a model echoing the options has not chosen); otherwise the last non-empty line.

It returns the answer text and its character span in the CoT, so :func:`answer_confidence`
can find the tokens that spell the answer and report ``exp(mean logprob)`` over them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from protocol.answers import AnswerType

#: Confidence reported when the answer's tokens cannot be located (e.g. no logprobs).
UNKNOWN_CONFIDENCE = 0.0

_FINAL_RE = re.compile(r"(?im)^[ \t>*_#-]*final[ \t]+answer[ \t*_]*(?:is)?[ \t]*[:=\-][ \t*_]*(.+?)[ \t]*$")
_FINAL_INLINE_RE = re.compile(r"(?i)final[ \t]+answer[ \t*_]*(?:is)?[ \t]*[:=][ \t]*(.+?)[ \t]*$", re.M)
_BOXED_RE = re.compile(r"\\boxed\{([^{}\n]+)\}")
_HASHES_RE = re.compile(r"(?m)^[ \t]*####[ \t]*(.+?)[ \t]*$")
_ANSWER_RE = re.compile(r"(?im)(?:^|[^\w])(?:the[ \t]+)?answer[ \t*_]*(?:is|:|=)[ \t:]*(.+?)[ \t]*$")
_NUMBER_RE = re.compile(r"[-\u2212]?\$?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")
_LETTER_RE = re.compile(r"(?<![\w])\(?([A-Z])(?:\)|\.(?!\w)|:)")


@dataclass(frozen=True, slots=True)
class Extracted:
    answer: str  # the raw answer text, as written by the model (trimmed)
    start: int  # character span of ``answer`` in the CoT text
    end: int
    rule: str  # which rule found it: final | boxed | hashes | answer | fallback


def _trim_span(text: str, start: int, end: int) -> tuple[int, int]:
    """Shrink [start, end) past whitespace, markdown emphasis and a trailing period."""
    while start < end and (text[start].isspace() or text[start] in "*_`"):
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in ".。*_`"):
        end -= 1
    return start, end


def _last(regex: re.Pattern[str], text: str, rule: str) -> Extracted | None:
    matches = [m for m in regex.finditer(text) if m.group(1).strip(" .*_`")]
    if not matches:
        return None
    m = matches[-1]
    start, end = _trim_span(text, m.start(1), m.end(1))
    return Extracted(text[start:end], start, end, rule)


def _choice_fallback(text: str, choices: Sequence[str]) -> Extracted | None:
    """The one option the text mentions (by letter "B)" or by its text); None if 0 or >1."""
    mentions: dict[int, tuple[int, int]] = {}  # option index -> span of its last mention
    for m in _LETTER_RE.finditer(text):
        index = ord(m.group(1)) - ord("A")
        if not choices or index < len(choices):
            mentions[index] = (m.start(1), m.end(1))
    lowered = text.casefold()
    for index, choice in enumerate(choices):
        c = choice.strip().casefold()
        for m in re.finditer(r"(?<!\w)" + re.escape(c) + r"(?!\w)", lowered) if c else ():
            mentions.setdefault(index, (m.start(), m.end()))
    if len(mentions) != 1:
        return None  # nothing, or an echo of several options: refuse to guess
    start, end = next(iter(mentions.values()))
    return Extracted(text[start:end], start, end, "fallback")


def extract_answer(text: str, answer_type: AnswerType, choices: Sequence[str] = ()) -> Extracted | None:
    """The final answer in ``text`` (see module docstring for the rules), or ``None``."""
    for regex, rule in ((_FINAL_RE, "final"), (_FINAL_INLINE_RE, "final"), (_BOXED_RE, "boxed"),
                        (_HASHES_RE, "hashes"), (_ANSWER_RE, "answer")):
        found = _last(regex, text, rule)
        if found is not None:
            return found
    if answer_type is AnswerType.NUMBER:
        numbers = list(_NUMBER_RE.finditer(text))
        if numbers:
            m = numbers[-1]
            return Extracted(m.group(0), m.start(), m.end(), "fallback")
        return None
    if answer_type is AnswerType.CHOICE:
        stripped = text.strip()
        if len(stripped) == 1 and stripped.isalpha():
            start = text.index(stripped)
            return Extracted(stripped, start, start + 1, "fallback")
        return _choice_fallback(text, choices)
    lines = [(m.start(), m.end()) for m in re.finditer(r"[^\n]+", text) if m.group(0).strip()]
    if not lines:
        return None
    start, end = _trim_span(text, *lines[-1])
    return Extracted(text[start:end], start, end, "fallback") if end > start else None


def token_char_offsets(token_ids: Sequence[int], detokenize: Callable[[Sequence[int]], str]) -> list[int]:
    """offsets[i] = characters of text before token i; offsets[n] = len(text). O(n^2) decodes."""
    offsets = [0]
    for i in range(1, len(token_ids) + 1):
        offsets.append(max(offsets[-1], len(detokenize(token_ids[:i]))))
    return offsets


def answer_confidence(extracted: Extracted | None, offsets: Sequence[int],
                      logprobs: Sequence[float]) -> float:
    """exp(mean logprob) of the tokens overlapping the answer span; in [0, 1].

    ``offsets`` comes from :func:`token_char_offsets` (n+1 entries for n tokens), ``logprobs``
    holds the sampled tokens' logprobs (n entries).
    """
    if extracted is None or not logprobs:
        return UNKNOWN_CONFIDENCE
    picked = [lp for i, lp in enumerate(logprobs)
              if i + 1 < len(offsets) and offsets[i] < extracted.end and offsets[i + 1] > extracted.start]
    if not picked:
        return UNKNOWN_CONFIDENCE
    return float(min(1.0, math.exp(sum(picked) / len(picked))))
