"""Requester side, results: checking each result, voting, finishing a task.

``ResultIntake`` is a component the ``protocol.market.auction.Auction`` holds (which documents
the promises and owns the task table). ``check`` holds the result checks (forged, unassigned,
replayed, late, oversized CoT, wrong model, another agent than the bid's; unparseable answers are kept as abstentions) and
returns either the checked result, for the auction to ``admit`` (the verification seam:
protocol/verification/requester.py checks a revealed result the same way and then decides
itself), or the refusal with the attempt to fail for it. ``finish`` votes (by the ``VoteRule``
the auction was given), attests each executor (completed when the other executors' ballots
confirm its answer, ``VoteOutcome.confirmed``, under the protocol's rule), rewards the
selector and releases everyone still held.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.answers import AnswerType, normalize_answer
from protocol.envelopes import PENALTY_FORGED
from protocol.machine import Effect, Emit, Send
from protocol.market.events import (
    COMPLETED,
    FAILED,
    TASK_ATTEST,
    TIMEOUT,
    WRONG,
    Attest,
    AuctionConfig,
    TaskUpdated,
)
from protocol.market.messages import RESULT_DOMAIN, Cancel, Result, ResultBody
from protocol.market.options import AuctionOptions
from protocol.market.refusals import assigned, count, opened, rejecter
from protocol.market.selection import Selector
from protocol.market.state import (
    Attempt,
    AttemptState,
    OpenTask,
    ResultInfo,
    TaskPhase,
    move_attempt,
    move_phase,
    snapshot,
)
from protocol.market.voting import Ballot, vote


@dataclass(frozen=True, slots=True)
class AttemptFailure:
    """An attempt the auction fails (``Auction.fail_attempt``) for a refused result."""

    task: OpenTask
    attempt: Attempt
    reason: str
    outcome: str | None
    cancel: bool


@dataclass(slots=True)
class Refused:
    """A result refused: the refusal's effects, and the attempt to fail for it (if any)."""

    effects: list[Effect]
    failure: AttemptFailure | None = None


class ResultIntake:
    """Result checks and the vote for the ``Auction`` that holds it."""

    def __init__(self, config: AuctionConfig, selector: Selector, options: AuctionOptions,
                 counters: dict[str, int]) -> None:
        self.config = config
        self.selector = selector
        self.options = options
        self.counters = counters

    def check(self, peer: str, msg: Result, tasks: dict[bytes, OpenTask],
              now: int) -> ResultInfo | Refused:
        reject = rejecter(self.counters, "task", "result", peer)
        body = opened(msg.envelope, RESULT_DOMAIN, ResultBody, self.config.max_frame, peer,
                      lambda b: b.executor, reject)
        if isinstance(body, list):
            return Refused(body)
        found = assigned(tasks, peer, body.task_id, body.attempt, reject)
        if isinstance(found, list):
            return Refused(found)
        task, attempt = found
        if attempt.state is AttemptState.ANSWERED:
            return Refused(reject("duplicate"))
        if attempt.state is not AttemptState.ASSIGNED or task.finished:
            return Refused(reject("late"))
        if now > attempt.due_at_ms:
            return Refused(reject("late"),
                           AttemptFailure(task, attempt, "timeout", TIMEOUT, cancel=True))
        if len(body.cot) > self.config.max_cot_chars:
            return Refused(reject("oversized", PENALTY_FORGED), AttemptFailure(
                task, attempt, "malformed:oversized cot", FAILED, cancel=False))
        bid_hash = attempt.bid.body.model_hash
        if bid_hash and body.model_hash != bid_hash:
            return Refused(reject("model_mismatch"), AttemptFailure(
                task, attempt, "malformed:model_mismatch", FAILED, cancel=False))
        if body.agent != attempt.bid.body.agent:
            return Refused(reject("agent_mismatch", PENALTY_FORGED), AttemptFailure(
                task, attempt, "malformed:agent_mismatch", FAILED, cancel=False))
        if normalize_answer(AnswerType(task.spec.answer_type), body.answer,
                            task.spec.choices) is None:
            # Honest work can end without a usable answer (a small model rambles): the result
            # stays as an abstaining ballot (weight 0) and is attested "wrong" when the vote
            # ends, not as a protocol failure that would exclude and replace the executor.
            count(self.counters, "unparseable_answers")
        return ResultInfo(body, msg.envelope, attempt.attempt, attempt.bid.match, now)

    def finish(self, task: OpenTask, now: int, why: str) -> list[Effect]:
        """End ``task``: release everyone still held, then vote (or fail without results)."""
        effects: list[Effect] = []
        for attempt in task.active:
            timed_out = now >= attempt.due_at_ms
            move_attempt(attempt, AttemptState.FAILED if timed_out else AttemptState.CANCELLED,
                         "timeout" if timed_out else "task ended")
            if timed_out:
                effects.append(Attest(attempt.peer, task.spec.task_id, TASK_ATTEST, TIMEOUT))
                self.selector.observe(task.spec.task_id, attempt.peer, 0.0)
            effects.append(Send(attempt.peer, Cancel(task_id=task.spec.task_id,
                                                     attempt=attempt.attempt)))
        for peer, info in list(task.spares.items()) + list(task.bids.items()):
            if now < info.hold_until_ms:
                effects.append(Send(peer, Cancel(task_id=task.spec.task_id, attempt=-1)))
        task.spares.clear()
        task.bids.clear()
        task.finished_at_ms = now
        task.forget_at_ms = now + self.config.keep_finished_ms
        if task.results and why != "cancelled":
            effects += self._vote(task)
        else:
            task.failure = why or "no result before the deadline"
            move_phase(task, TaskPhase.FAILED)
            count(self.counters, "tasks_failed")
            effects.append(Emit("task.failed", {"task_id": task.spec.task_id.hex(),
                                                "why": task.failure}))
        effects.append(TaskUpdated(snapshot(task)))
        return effects

    def _vote(self, task: OpenTask) -> list[Effect]:
        tid = task.spec.task_id
        ballots = [Ballot(p, r.body.answer, r.body.confidence, self.options.reputation(p),
                          r.match_score) for p, r in task.results.items()]
        task.outcome = vote(ballots, AnswerType(task.spec.answer_type), task.spec.choices,
                            self.options.voting.weigh)
        task.partial = len(task.results) < task.spec.k
        move_phase(task, TaskPhase.DONE)
        count(self.counters, "tasks_done")
        effects: list[Effect] = []
        for p in task.results if not task.deferred else ():
            agreed = (task.outcome.confirmed(p) if self.options.voting.confirm_by_others
                      else task.outcome.agrees(p))
            effects.append(Attest(p, tid, TASK_ATTEST, COMPLETED if agreed else WRONG))
            if self.config.reward_on_vote:
                self.selector.observe(tid, p, 1.0 if agreed else 0.0)
        effects.append(Emit("task.done", {"task_id": tid.hex(), "answer": task.outcome.winner,
                                          "votes": len(task.results), "partial": task.partial}))
        return effects
