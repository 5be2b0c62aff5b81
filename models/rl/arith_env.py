"""A format-and-answer environment the default model can learn on a CPU: one-step arithmetic.

The prompts are every distinct question ``a + b`` and ``a - b`` (``a >= b``, so no negative
answers) with ``a, b`` in ``[0, ARITH_MAX]``, in an order shuffled by a fixed seed: the same
prompts on every machine, no two alike (so a held-out prompt never reappears among the
training ones, models/rl/env.py's split). Each asks for the answer as one line
``Final answer: <number>``. A completion earns

- ``ANSWER_REWARD`` when its last integer is the right answer, whatever its form;
- ``FORMAT_REWARD`` on top when it is well formed: its text, stripped, ends with a line
  holding an integer and nothing else, after ``Final answer:``, ``Answer:`` or ``The answer
  is`` (any case, the colon optional) or bare, an optional full stop after it, with at most
  ``WORKING_LINES`` line of working before it (blank lines not counted).

A completion is *correct* (what the held-out accuracy counts, models/rl/heldout.py) when it
earns both: the task is the format and the answer together. Why the parts:

- Asked freely, the default model writes the equation (``8 - 3 = 5``) and stops there, right
  more often than not; it almost never writes the ``Final answer:`` line, and the answers it
  gives with no working are mostly guesses. Rewarding the format alone teaches the shortest
  well-formed reply, a bare guess, and the arithmetic is lost.
- Crediting the right last number keeps the worked equation as good as a bare guess, so the
  policy keeps it, and the best reply is the equation followed by an answer line (the model
  writes ``The answer is: 29`` after one now and then): that is where GRPO
  can move, one group at a time.
"""

from __future__ import annotations

import random
import re

from models.backend import Message

#: operands are in [0, ARITH_MAX]
ARITH_MAX = 20
FORMAT_REWARD = 0.5
ANSWER_REWARD = 1.0

_INT_RE = re.compile(r"-?\d+")
_LINE_RE = re.compile(r"(?:(?:Final answer|The answer is|Answer):?[ \t]*)?(-?\d+)\.?", re.IGNORECASE)


def questions(most: int = ARITH_MAX) -> list[tuple[str, int]]:
    """Every distinct question with operands in [0, most] and its answer, shuffled by a fixed
    seed."""
    out = [(f"{a} + {b}", a + b) for a in range(most + 1) for b in range(most + 1)]
    out += [(f"{a} - {b}", a - b) for a in range(most + 1) for b in range(a + 1)]
    random.Random(0).shuffle(out)
    return out


#: lines of working allowed before the answer line
WORKING_LINES = 1


def well_formed(completion: str) -> int | None:
    """The integer of a well-formed completion, else None."""
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    if not lines or len(lines) > WORKING_LINES + 1:
        return None
    m = _LINE_RE.fullmatch(lines[-1].strip())
    return int(m.group(1)) if m else None


class ArithmeticEnvironment:
    def __init__(self, most: int = ARITH_MAX) -> None:
        if most < 1:
            raise ValueError(f"operands need a range of at least [0, 1], got [0, {most}]")
        self._questions = questions(most)

    @property
    def size(self) -> int:
        return len(self._questions)

    def _question(self, index: int) -> tuple[str, int]:
        if not 0 <= index < len(self._questions):
            raise IndexError(f"prompt index {index} outside [0, {len(self._questions)})")
        return self._questions[index]

    def answer(self, index: int) -> int:
        return self._question(index)[1]

    def prompt(self, index: int) -> list[Message]:
        question, _ = self._question(index)
        return [{"role": "user",
                 "content": f"What is {question}? Write {question} = <number> on one line, "
                            "then the line: Final answer: <number>"}]

    def reward(self, prompt: int, completion: str) -> float:
        numbers = _INT_RE.findall(completion)
        right = bool(numbers) and int(numbers[-1]) == self.answer(prompt)
        formed = well_formed(completion) is not None
        return (ANSWER_REWARD if right else 0.0) + (FORMAT_REWARD if formed else 0.0)

    def correct(self, prompt: int, completion: str) -> bool:
        return well_formed(completion) == self.answer(prompt)
