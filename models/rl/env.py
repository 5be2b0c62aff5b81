"""RL environments: prompts by index and a reward the learner computes from the completion.

An environment is any object with

- ``size``: how many prompts it has (a rollout job names prompts by index in ``[0, size)``,
  derived from the job's seed by protocol/rl/prompts.py, so a worker cannot pick easy ones);
- ``prompt(index) -> list[Message]``: the chat messages of prompt ``index``;
- ``reward(prompt, completion) -> float``: the reward of a completion's text for prompt index
  ``prompt``.

Users plug their own in with ``environment = "package.module:factory"`` in rl.toml
(:func:`load_environment`): ``factory()`` returns such an object. Rewards are always computed
by the learner, never taken from a worker.

The shipped one, :class:`EvalsetEnvironment`, is the numeric half of the embedded evaluation
set (models/evalset.py): a completion earns ``FORMAT_REWARD`` for a ``Final answer: ...`` line
and ``ANSWER_REWARD`` when its answer (that line's, else its last number, as models/extract.py
reads it) is exactly the expected number.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from models.backend import Message
from models.cot import build_messages
from models.evalset import EvalItem, load_evalset
from models.extract import extract_answer
from protocol.answers import AnswerType, normalize_answer

#: reward for a well-formed final answer line, and for the right number on top of it
FORMAT_REWARD = 0.2
ANSWER_REWARD = 1.0


@runtime_checkable
class Environment(Protocol):
    @property
    def size(self) -> int: ...

    def prompt(self, index: int) -> list[Message]: ...

    def reward(self, prompt: int, completion: str) -> float: ...


class EvalsetEnvironment:
    """The NUMBER items of the shipped evaluation set; ``cot``: ask for a chain of thought
    (long completions) or for the bare answer line (a few tokens, what the bench uses)."""

    def __init__(self, items: Sequence[EvalItem] | None = None, *, cot: bool = False) -> None:
        pool = load_evalset() if items is None else list(items)
        self.items = [it for it in pool if it.problem.answer_type is AnswerType.NUMBER]
        if not self.items:
            raise ValueError("the evaluation set holds no numeric items")
        self.cot = cot

    @property
    def size(self) -> int:
        return len(self.items)

    def _item(self, index: int) -> EvalItem:
        if not 0 <= index < len(self.items):
            raise IndexError(f"prompt index {index} outside [0, {len(self.items)})")
        return self.items[index]

    def prompt(self, index: int) -> list[Message]:
        return build_messages(self._item(index).problem, cot=self.cot)

    def reward(self, prompt: int, completion: str) -> float:
        item = self._item(prompt)
        found = extract_answer(completion, AnswerType.NUMBER, ())
        if found is None:
            return 0.0
        shaped = FORMAT_REWARD if found.rule == "final" else 0.0
        got = normalize_answer(AnswerType.NUMBER, found.answer, ())
        return shaped + (ANSWER_REWARD if got is not None and got == item.answer else 0.0)


def load_environment(spec: str) -> Environment:
    """``"evalset"`` (the shipped one, bare answers), ``"evalset-cot"``, or
    ``"package.module:factory"`` whose call returns an :class:`Environment`."""
    if spec == "evalset":
        return EvalsetEnvironment()
    if spec == "evalset-cot":
        return EvalsetEnvironment(cot=True)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"environment {spec!r}: expected 'evalset', 'evalset-cot' or "
                         "'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"environment {spec!r} cannot be loaded: {exc}") from None
    env = factory()
    if not isinstance(env, Environment) or env.size < 1:
        raise ValueError(f"environment {spec!r}: {attr}() must return an object with size >= 1, "
                         "prompt(index) and reward(prompt, completion)")
    return env
