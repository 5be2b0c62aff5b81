"""A test double for the executor's solver: deterministic arithmetic, no model.

Daemon tests load it with ``[executor] solver = "tests.node.arith_solver:factory"`` (the
executor imports any importable "module:callable"; test daemons run from the checkout with
it on PYTHONPATH). It is not shipped and never what a user's node or a benchmark runs.

It answers questions containing ``a <op> b`` (op in + - *) with a short chain of thought and
a final answer line, in ``SYMPHONY_ARITH_SOLVER_DELAY_MS`` milliseconds of simulated compute
(default 50), and advertises the matching speed (``NOMINAL_TOKENS`` in that time), so bids
estimate it. Daemon tests need answers that are fast, known and take a fixed time. As a
planner (style ``plan``) it writes a one-step plan: compute the expression it found.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from crypto.hashing import digest
from protocol.market.events import ComputeDone
from protocol.market.executor import ServedModel
from protocol.market.messages import TaskSpec

DELAY_ENV = "SYMPHONY_ARITH_SOLVER_DELAY_MS"
MODEL_NAME = "test-arith"
MODEL_HASH = digest(b"test-arith-weights")
#: tokens a task is assumed to take, for the advertised tokens/s
NOMINAL_TOKENS = 256
_EXPR = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")


class ArithmeticSolver:
    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms

    def models(self) -> list[ServedModel]:
        return [ServedModel(name=MODEL_NAME, family="test", context=4096, model_hash=MODEL_HASH,
                            tokens_per_s=NOMINAL_TOKENS * 1000 / max(1, self.delay_ms),
                            price_per_1k=0.0)]

    def solve(self, task: TaskSpec, model: str, max_tokens: int, attempt: int = 0) -> ComputeDone:
        started = time.monotonic()
        time.sleep(self.delay_ms / 1000)  # stands in for generation time
        m = _EXPR.search(task.question)
        if task.style == "plan":  # a planner: one step, the expression it found
            expr = m.group(0) if m is not None else "the question"
            cot = answer = json.dumps({"steps": [{
                # skills only: a need text would have the requester load its text embedder
                "instruction": f"Compute {expr}.", "needs": "", "skills": ["arithmetic"]}]})
        elif m is None:
            cot, answer = "I cannot find an expression.\nFinal answer: unknown", "unknown"
        else:
            a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
            value = a + b if op == "+" else a - b if op == "-" else a * b
            cot = f"We compute {a} {op} {b} step by step.\nThat is {value}.\nFinal answer: {value}"
            answer = str(value)
        return ComputeDone(task_id=task.task_id, attempt=attempt, answer=answer, cot=cot,
                           confidence=0.9, tokens=len(cot.split()),
                           compute_ms=int((time.monotonic() - started) * 1000),
                           model_hash=MODEL_HASH)


def factory(section: Any, data_dir: Path) -> ArithmeticSolver:
    return ArithmeticSolver(int(os.environ.get(DELAY_ENV, "50")))
