"""Drafting while the target verifies: the lookahead.

:class:`Drafting` gives a decoding loop (models.speculative) each step's draft. With a second
drafter for the lookahead it also drafts ahead: as the loop sends a draft ``d_1..d_k`` to the
target (:meth:`Drafting.look_ahead`), a thread of its own drafts on as if all of it is kept,
first its guess ``g`` of the target's bonus token, then the next step's draft. On the verdict
(:meth:`Drafting.settle`) protocol.inference.speculative.reusable_lookahead says whether the
lookahead holds (every draft kept and the bonus guessed): then what it has drafted so far
opens the next draft and the loop's drafter drafts only the rest; otherwise it is dropped.

The lookahead never waits on the loop nor the loop on it: it runs on its own llama.cpp
context (the second drafter), so the loop never waits for the token it is on, and the verdict
takes what it has drafted by then. With ``idle`` its thread is scheduled ``SCHED_IDLE`` where
the OS has it, so it takes only CPU this process's other threads leave: for a process that
computes the target itself (a drafting thread of normal priority competes with the target's
compute in the same process, and on shared cores slows it by more than the drafting saves).
A requester whose target is a chain of other processes runs it at its own priority: at
``SCHED_IDLE`` it would get almost no CPU beside the stages' processes and draft too little to
gain, while at its own priority it drafts ahead of every step and cuts the drafting the steps
wait for.

Overlap is for deterministic drafts only (greedy drafting): a sampled draft draws from the
generation's one ``random.Random``, which the verification draws from too, so a draft drawn
while verifying would make a seeded output depend on timing.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from models.drafters import EMPTY, Draft, Drafter
from protocol.inference.speculative import reusable_lookahead

__all__ = ["Drafting"]


@dataclass
class _Ahead:
    """One lookahead: ``context`` extended by up to ``limit`` tokens, token by token."""

    context: tuple[int, ...]
    limit: int
    tokens: list[int] = field(default_factory=list)
    stopped: bool = False


class Drafting:
    """One generation's drafts (see the module docstring). ``lookahead``: a second drafter of
    the same model, or None for no overlap; ``idle``: its thread at idle priority."""

    def __init__(self, drafter: Drafter, rng: random.Random,
                 lookahead: Drafter | None = None, *, idle: bool = True) -> None:
        self._drafter, self._rng = drafter, rng
        self._cond = threading.Condition()
        self._ahead: _Ahead | None = None  # the lookahead running or queued
        self._taken: tuple[int, ...] = ()  # a held lookahead's tokens for the next draft
        self._closing = False
        self.spent_s, self.drafted = 0.0, 0  # the loop's drafter's time and tokens
        self.ahead_s, self.ahead_tokens = 0.0, 0  # the lookahead's time and tokens
        self.hits = 0  # verdicts that left the lookahead holding
        self.error: Exception | None = None  # what stopped the lookahead's drafter, if any
        self._thread: threading.Thread | None = None
        if lookahead is not None:
            self._thread = threading.Thread(target=self._work, args=(lookahead, idle),
                                            name="draft-lookahead", daemon=True)
            self._thread.start()

    @property
    def overlap(self) -> bool:
        return self._thread is not None

    @property
    def ms_per_token(self) -> float:
        """The loop's drafter's time per token it drafted (0 before any)."""
        return 1000 * self.spent_s / self.drafted if self.drafted else 0.0

    def next(self, context: Sequence[int], k: int) -> Draft:
        """Up to ``k`` tokens to follow ``context``: what a held lookahead drafted, then the
        rest from the loop's drafter."""
        taken, self._taken = list(self._taken[:k]), ()
        if k <= 0:
            return EMPTY
        if len(taken) >= k:
            return Draft(tuple(taken))
        started = time.perf_counter()
        more = self._drafter.draft([*context, *taken], k - len(taken), self._rng)
        self.spent_s += time.perf_counter() - started
        self.drafted += len(more.tokens)
        if not taken:
            return more
        return Draft((*taken, *more.tokens))  # deterministic drafts only: no distributions

    def look_ahead(self, context: Sequence[int], k: int) -> None:
        """The draft (the last ``k`` tokens of ``context``) goes to the target: draft on
        meanwhile, the bonus guess and ``k`` more."""
        if self._thread is None or k <= 0:
            return
        with self._cond:
            self._ahead = _Ahead(tuple(int(t) for t in context), k + 1)
            self._cond.notify_all()

    def settle(self, sent: Sequence[int], kept: Sequence[int]) -> None:
        """The verdict on ``sent``: ``kept`` emitted. Stop the lookahead; keep what it drafted
        for the next draft if it holds."""
        with self._cond:
            ahead, self._ahead = self._ahead, None
            if ahead is None:
                return
            ahead.stopped = True
            got = tuple(ahead.tokens)
        rest = reusable_lookahead(sent, kept, got)
        if rest is not None:
            self._taken = rest
            self.hits += 1

    def close(self) -> None:
        """Stop the lookahead's thread (after the token it is on); the drafters stay open."""
        with self._cond:
            self._closing = True
            if self._ahead is not None:
                self._ahead.stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    # ------------------------------------------------------------ the lookahead's thread

    def _work(self, drafter: Drafter, idle: bool) -> None:
        if idle:
            _idle_priority()
        rng = random.Random(0)  # unused by a deterministic drafter
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or self._runnable())
                if self._closing:
                    return
                ahead = self._ahead
                assert ahead is not None
                context = [*ahead.context, *ahead.tokens]
            started = time.perf_counter()
            try:
                draft = drafter.draft(context, 1, rng) if len(context) else EMPTY
            except Exception as exc:  # no lookahead from here on; the loop drafts on its own
                with self._cond:
                    self.error = exc
                    ahead.stopped = True
                return
            with self._cond:
                self.ahead_s += time.perf_counter() - started
                self.ahead_tokens += len(draft.tokens)
                if ahead.stopped:
                    continue
                ahead.tokens.extend(int(t) for t in draft.tokens)
                if not draft.tokens:
                    ahead.stopped = True

    def _runnable(self) -> bool:
        ahead = self._ahead
        return ahead is not None and not ahead.stopped and len(ahead.tokens) < ahead.limit


def _idle_priority() -> None:
    """Schedule the calling thread only when nothing else wants the CPU (Linux: SCHED_IDLE;
    elsewhere the lowest nice value), best effort."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
    except (AttributeError, OSError):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
