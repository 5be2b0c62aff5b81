"""A test double for the executor's solver: the arithmetic of ``arith_solver``, answered wrong
and unsure.

It works the question out like :class:`tests.node.arith_solver.ArithmeticSolver`, then
answers one more than the right value with confidence ``DISSENT_CONFIDENCE``. Two of these
against one honest executor make a vote whose winner depends on the weighting: counted by
heads, the wrong answer wins; weighted by confidence (``protocol.market.voting``), the right
one does. Daemons load it with ``[executor] solver = "tests.node.dissenting_solver:factory"``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from protocol.market.messages import TaskSpec
from tests.node.arith_solver import DELAY_ENV, ArithmeticSolver

#: the dissenter's stated confidence: low enough that two of them weigh less than one honest
DISSENT_CONFIDENCE = 0.05


class DissentingSolver(ArithmeticSolver):
    def solve(self, task: TaskSpec, model: str, max_tokens: int, attempt: int = 0) -> Any:
        right = super().solve(task, model, max_tokens, attempt)
        if not right.answer.lstrip("-").isdigit():
            return right
        wrong = str(int(right.answer) + 1)
        cot = right.cot.replace(f"Final answer: {right.answer}", f"Final answer: {wrong}")
        return dataclasses.replace(right, answer=wrong, cot=cot, confidence=DISSENT_CONFIDENCE)


def factory(section: Any, data_dir: Path) -> DissentingSolver:
    return DissentingSolver(int(os.environ.get(DELAY_ENV, "50")))
