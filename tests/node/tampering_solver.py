"""A test double for the executor's solver: the real models solver, whose results are tampered
with after it committed to them.

It solves a task as ``models.solver.ModelsSolver`` does (the model of ``[executor] model``,
its layer states captured and committed), then changes the first output token to another one
and sends the CoT as the detokenized changed output and the answer as that CoT's: the binding
checks (CoT is the output, the answer is the CoT's) still hold, and only the committed layer
states (computed on the honest token) give it away, at layer 1. It is the ``tamper`` adversary
of ``symphony bench verify`` in a daemon. Load it with
``[executor] solver = "tests.node.tampering_solver:factory"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.cot import Problem, answer_of, problem_of
from models.solver import ModelsSolver
from protocol.market.events import ComputeDone
from protocol.market.messages import MAX_ANSWER_CHARS, TaskSpec


class TamperingSolver(ModelsSolver):
    def solve(self, task: TaskSpec, model: str, max_tokens: int, attempt: int = 0,
              **context: Any) -> ComputeDone:
        honest = super().solve(task, model, max_tokens, attempt, **context)
        problem = problem_of(task, context.get("system_prompt", ""),
                             context.get("tool_calls", ()))
        ids, cot, answer = tampered(self.backend, problem, honest.output_ids)
        return dataclasses.replace(honest, output_ids=ids, cot=cot, answer=answer)


def tampered(backend: Any, problem: Problem,
             output_ids: Sequence[int]) -> tuple[tuple[int, ...], str, str]:
    """(output ids with the first one changed, their text, the answer that text gives)."""
    ids = list(output_ids)
    ids[0] = other_token(backend, ids[0])
    text = backend.detokenize(ids)
    return tuple(ids), text, answer_of(problem, text)[:MAX_ANSWER_CHARS]


def other_token(backend: Any, token: int) -> int:
    """A token other than ``token`` that ends a plain word (" So" or " Well"), not a control
    token (the tokenizer may put BOS first)."""
    for word in (" So", " Well"):
        other = int(backend.tokenize(word)[-1])
        if other != token:
            return other
    raise AssertionError("unreachable: the two words end in different tokens")


def factory(section: Any, data_dir: Path) -> TamperingSolver:
    from node.market.executor import models_solver

    honest = models_solver(section, data_dir)
    assert isinstance(honest, ModelsSolver)
    return TamperingSolver(honest.backend, states=honest.states)
