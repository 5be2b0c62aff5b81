"""A format-and-answer environment the default model can learn on a CPU: one-step arithmetic.

The prompts are every distinct question ``a + b`` and ``a - b`` (``a >= b``, so no negative
answers) with ``a, b`` in ``[0, ARITH_MAX]``, in an order shuffled by a fixed seed: the same
prompts on every machine, no two alike (so a held-out prompt never reappears among the
training ones, models/rl/env.py's split). Each asks for the answer as one line
``Final answer: <number>``, after the equation. A completion earns

- ``FORMAT_REWARD`` when it is well formed: its text, stripped, ends with a line holding an
  integer and nothing else, after ``Final answer:``, ``Answer:`` or ``The answer is`` (any
  case, the colon optional) or bare, an optional full stop after it, with at most
  ``WORKING_LINES`` line of working before it (blank lines not counted);
- ``ANSWER_REWARD`` on top when, well formed, that integer is the right one.

So the reward is 0, ``FORMAT_REWARD`` or ``FORMAT_REWARD + ANSWER_REWARD``, and a completion is
*correct* (what the held-out accuracy counts, models/rl/heldout.py) when it earns both: the
task is the format and the answer together. Why this form:

- Asked freely, the default model writes the equation (``8 - 3 = 5``) and stops, right more
  often than not; the answers it gives with no working are mostly guesses. A task whose only
  well-formed reply is the bare answer teaches a bare guess, and the arithmetic is lost.
- Asked for the equation and then the answer line, it often writes the equation and
  ``The answer is: 5`` after it (the phrasing it prefers to ``Final answer:``), which is why
  those phrasings count: the format is within reach of sampling, so GRPO gets a signal from
  the first steps, and what it improves is the equation's result and how often the answer
  line follows it.
- A right number outside the form earns nothing: credited, it taught the model to drop the
  answer line (the equation alone earned almost as much, and more reliably).
"""

from __future__ import annotations

import random
import re

from models.backend import Message

#: operands are in [0, ARITH_MAX]
ARITH_MAX = 20
FORMAT_REWARD = 0.5
ANSWER_REWARD = 1.0

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
    #: hold out one prompt in about two (models/rl/env.py's split): a run samples a few dozen
    #: of the training prompts, so half of them is plenty for training, and the held-out
    #: accuracy's 95% interval narrows with the square root of the prompts it is taken over
    heldout_every = 2

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
        got = well_formed(completion)
        if got is None:
            return 0.0
        return FORMAT_REWARD + (ANSWER_REWARD if got == self.answer(prompt) else 0.0)

    def correct(self, prompt: int, completion: str) -> bool:
        return well_formed(completion) == self.answer(prompt)
