"""RL environments: prompts by index and a reward the learner computes from the completion.

An environment is any object with

- ``size``: how many prompts it has (a rollout job names prompts by index in ``[0, size)``,
  derived from the job's seed by protocol/rl/prompts.py, so a worker cannot pick easy ones);
- ``prompt(index) -> list[Message]``: the chat messages of prompt ``index``;
- ``reward(prompt, completion) -> float``: the reward of a completion's text for prompt index
  ``prompt``;
- optionally ``correct(prompt, completion) -> bool``: whether the completion solves the
  prompt, what the held-out accuracy counts (without it: a reward above 0);
- optionally ``heldout_every``: hold out about one prompt in this many (without it:
  ``HELDOUT_EVERY``).

Users plug their own in with ``environment = "package.module:factory"`` in rl.toml
(:func:`load_full_environment`): ``factory()`` returns such an object. Rewards are always
computed by the learner, never taken from a worker.

**The held-out split** (:func:`split`) is a fixed rule on each prompt's text, not its index:
prompt ``i`` is held out when the first 8 bytes of BLAKE2b over its chat messages (canonical
JSON), as an integer, are divisible by the environment's ``heldout_every`` (``HELDOUT_EVERY``
unless it says otherwise): about one prompt in that many, the same ones on every machine
whatever order an environment lists its prompts in. Learners and workers load the training
view (:func:`load_environment`, prompts renumbered from 0), so no rollout job can name a
held-out prompt; evaluation loads the other (:func:`load_heldout`).

Shipped: ``"arith"`` (models/rl/arith_env.py), a format-and-answer task the default model
learns; and :class:`EvalsetEnvironment`, the numeric half of the embedded evaluation
set (models/evalset.py): a completion earns ``FORMAT_REWARD`` for a ``Final answer: ...`` line
and ``ANSWER_REWARD`` when its answer (that line's, else its last number, as models/extract.py
reads it) is exactly the expected number.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

from models.backend import Message
from models.cot import build_messages
from models.evalset import EvalItem, load_evalset
from models.extract import extract_answer
from protocol.answers import AnswerType, normalize_answer

T = TypeVar("T")

#: reward for a well-formed final answer line, and for the right number on top of it
FORMAT_REWARD = 0.2
ANSWER_REWARD = 1.0


@runtime_checkable
class Environment(Protocol):
    @property
    def size(self) -> int: ...

    def prompt(self, index: int) -> list[Message]: ...

    def reward(self, prompt: int, completion: str) -> float: ...


def prompt_at(prompts: Sequence[T], index: int) -> T:
    """``prompts[index]`` for a prompt index of an environment: ``IndexError`` outside
    ``[0, size)`` (a negative index does not count from the end)."""
    if not 0 <= index < len(prompts):
        raise IndexError(f"prompt index {index} outside [0, {len(prompts)})")
    return prompts[index]


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
        return prompt_at(self.items, index)

    def prompt(self, index: int) -> list[Message]:
        return build_messages(self._item(index).problem, cot=self.cot)

    def reward(self, prompt: int, completion: str) -> float:
        found = extract_answer(completion, AnswerType.NUMBER, ())
        if found is None:
            return 0.0
        shaped = FORMAT_REWARD if found.rule == "final" else 0.0
        return shaped + (ANSWER_REWARD if self.correct(prompt, completion) else 0.0)

    def correct(self, prompt: int, completion: str) -> bool:
        """Whether the completion's answer is exactly the expected number."""
        item = self._item(prompt)
        found = extract_answer(completion, AnswerType.NUMBER, ())
        got = None if found is None else normalize_answer(AnswerType.NUMBER, found.answer, ())
        return got is not None and got == item.answer


#: one prompt in about this many is held out, unless the environment's ``heldout_every`` says
HELDOUT_EVERY = 5


def heldout_every(env: Environment) -> int:
    """The environment's ``heldout_every`` (an int >= 2), else ``HELDOUT_EVERY``."""
    every = getattr(env, "heldout_every", HELDOUT_EVERY)
    if isinstance(every, bool) or not isinstance(every, int) or every < 2:
        raise ValueError(f"heldout_every must be an integer >= 2, got {every!r}")
    return every


def is_heldout(messages: Sequence[Message], every: int = HELDOUT_EVERY) -> bool:
    data = json.dumps(list(messages), sort_keys=True, ensure_ascii=False).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") % every == 0


class SplitEnvironment:
    """The prompts of ``env`` at ``indices``, renumbered from 0 (an environment itself)."""

    def __init__(self, env: Environment, indices: Sequence[int]) -> None:
        self.env, self.indices = env, tuple(indices)

    @property
    def size(self) -> int:
        return len(self.indices)

    def _index(self, index: int) -> int:
        return prompt_at(self.indices, index)

    def prompt(self, index: int) -> list[Message]:
        return self.env.prompt(self._index(index))

    def reward(self, prompt: int, completion: str) -> float:
        return self.env.reward(self._index(prompt), completion)

    def correct(self, prompt: int, completion: str) -> bool:
        judge = getattr(self.env, "correct", None)
        if judge is not None:
            return bool(judge(self._index(prompt), completion))
        return self.reward(prompt, completion) > 0


def split(env: Environment) -> tuple[SplitEnvironment, SplitEnvironment]:
    """(training view, held-out view) of ``env`` by :func:`is_heldout`; ``ValueError`` when
    either side would be empty."""
    size, every = env.size, heldout_every(env)
    held = [is_heldout(env.prompt(i), every) for i in range(size)]
    train = [i for i in range(size) if not held[i]]
    heldout = [i for i in range(size) if held[i]]
    if not train or not heldout:
        raise ValueError(f"the environment's {size} prompts split into {len(train)} for "
                         f"training and {len(heldout)} held out: both need at least one")
    return SplitEnvironment(env, train), SplitEnvironment(env, heldout)


def load_environment(spec: str) -> SplitEnvironment:
    """The training view of :func:`load_full_environment` (its held-out prompts removed):
    what learners and rollout workers use, so jobs never name a held-out prompt."""
    return split(load_full_environment(spec))[0]


def load_heldout(spec: str) -> SplitEnvironment:
    """The held-out view of :func:`load_full_environment`: what evaluation answers."""
    return split(load_full_environment(spec))[1]


def load_full_environment(spec: str) -> Environment:
    """``"arith"`` (models/rl/arith_env.py: format and one-step arithmetic), ``"evalset"``
    (the evaluation set's numeric items, bare answers), ``"evalset-cot"``, or
    ``"package.module:factory"`` whose call returns an :class:`Environment`."""
    if spec == "arith":
        from models.rl.arith_env import ArithmeticEnvironment

        return ArithmeticEnvironment()
    if spec == "evalset":
        return EvalsetEnvironment()
    if spec == "evalset-cot":
        return EvalsetEnvironment(cot=True)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"environment {spec!r}: expected 'arith', 'evalset', 'evalset-cot' or "
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
