"""Requester side, second half: taking results in, voting, finishing a task.

``ResultIntake`` is mixed into ``protocol.market.auction.Auction`` (which documents the promises);
it holds the result checks (forged, unassigned, replayed, late, oversized CoT, wrong model;
unparseable answers are kept as abstentions), ``admit`` (the verification seam: a
commit/reveal step wraps it) and ``_finish`` (vote, attest each executor: completed when
the other executors' ballots confirm its answer, ``VoteOutcome.confirmed``; reward the
selector, release everyone still held).
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.answers import AnswerType, normalize_answer
from protocol.envelopes import PENALTY_FORGED, Unopened, open_authored
from protocol.machine import Effect, Emit, Send
from protocol.market.events import (
    COMPLETED,
    FAILED,
    TASK_ATTEST,
    TIMEOUT,
    WRONG,
    Attest,
)
from protocol.market.messages import (
    RESULT_DOMAIN,
    Cancel,
    Reject,
    RejectReason,
    Result,
    ResultBody,
)
from protocol.market.parts import AuctionParts
from protocol.market.state import (
    AttemptState,
    OpenTask,
    ResultInfo,
    TaskPhase,
    move_attempt,
    move_phase,
)
from protocol.market.voting import Ballot, ballot_weight, vote


class ResultIntake(AuctionParts):
    #: how a ballot weighs (protocol.market.voting's rule), and whether an executor's answer
    #: must be confirmed by the others' ballots to be attested completed (else: agree with the
    #: winner); the voting scenario measures the former rule by giving its comparison runs'
    #: requesters that (ballot weight as claimed, False) instead
    weigh: Callable[[Ballot], float] = staticmethod(ballot_weight)
    confirm_by_others: bool = True

    # ------------------------------------------------------------------ results

    def _on_reject(self, peer: str, msg: Reject, now: int) -> list[Effect]:
        task = self.tasks.get(msg.task_id)
        attempt = task.attempts.get(msg.attempt) if task is not None else None
        if task is None or attempt is None or attempt.peer != peer \
                or attempt.state is not AttemptState.ASSIGNED:
            self._count("rejects_ignored")
            return []
        outcome = FAILED if msg.reason is RejectReason.COMPUTE_FAILED else None
        return self._fail_attempt(task, attempt, f"rejected:{msg.reason.value}", outcome, now,
                                  cancel=False)

    def _on_result(self, peer: str, msg: Result, now: int) -> list[Effect]:
        reject = self._rejecter("task", "result", peer)

        try:
            body = open_authored(msg.envelope, RESULT_DOMAIN, ResultBody,
                                 self.config.max_frame, sender=peer, author=lambda b: b.executor)
        except Unopened as refused:
            return reject(refused.why, PENALTY_FORGED)
        found = self._assigned(peer, body.task_id, body.attempt, reject)
        if isinstance(found, list):
            return found
        task, attempt = found
        if attempt.state is AttemptState.ANSWERED:
            return reject("duplicate")
        if attempt.state is not AttemptState.ASSIGNED or task.finished:
            return reject("late")
        if now > attempt.due_at_ms:
            return reject("late") + self._fail_attempt(task, attempt, "timeout", TIMEOUT, now)
        if len(body.cot) > self.config.max_cot_chars:
            return reject("oversized", PENALTY_FORGED) + self._fail_attempt(
                task, attempt, "malformed:oversized cot", FAILED, now, cancel=False)
        bid_hash = attempt.bid.body.model_hash
        if bid_hash and body.model_hash != bid_hash:
            return reject("model_mismatch") + self._fail_attempt(
                task, attempt, "malformed:model_mismatch", FAILED, now, cancel=False)
        if normalize_answer(AnswerType(task.spec.answer_type), body.answer,
                            task.spec.choices) is None:
            # Honest work can end without a usable answer (a small model rambles): the result
            # stays as an abstaining ballot (weight 0) and is attested "wrong" when the vote
            # ends, not as a protocol failure that would exclude and replace the executor.
            self._count("unparseable_answers")
        return self.admit(task, ResultInfo(body, msg.envelope, attempt.attempt,
                                           attempt.bid.body.match_score, now), now)

    def admit(self, task: OpenTask, result: ResultInfo, now: int) -> list[Effect]:
        """Keep a checked result; vote once ``k`` are in (the verification seam)."""
        attempt = task.attempts[result.attempt]
        move_attempt(attempt, AttemptState.ANSWERED)
        task.results[attempt.peer] = result
        self._count("results_accepted")
        effects: list[Effect] = [Emit("task.result", {
            "task_id": task.spec.task_id.hex(), "peer": attempt.peer,
            "answer": result.body.answer, "latency_ms": now - attempt.assigned_at_ms})]
        if len(task.results) >= task.spec.k:
            return effects + self._finish(task, now, "")
        if not task.active and task.phase is TaskPhase.RUNNING:
            return effects + self._replan(task, now)
        effects.append(self._updated(task))
        return effects

    # ------------------------------------------------------------------ finishing

    def _finish(self, task: OpenTask, now: int, why: str) -> list[Effect]:
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
        tid = task.spec.task_id
        if task.results and why != "cancelled":
            ballots = [Ballot(p, r.body.answer, r.body.confidence, self.reputation(p),
                              r.match_score) for p, r in task.results.items()]
            task.outcome = vote(ballots, AnswerType(task.spec.answer_type), task.spec.choices,
                                self.weigh)
            task.partial = len(task.results) < task.spec.k
            move_phase(task, TaskPhase.DONE)
            self._count("tasks_done")
            for p in task.results:
                agreed = (task.outcome.confirmed(p) if self.confirm_by_others
                          else task.outcome.agrees(p))
                effects.append(Attest(p, tid, TASK_ATTEST, COMPLETED if agreed else WRONG))
                if self.config.reward_on_vote:
                    self.selector.observe(tid, p, 1.0 if agreed else 0.0)
            effects.append(Emit("task.done", {"task_id": tid.hex(),
                                              "answer": task.outcome.winner,
                                              "votes": len(task.results),
                                              "partial": task.partial}))
        else:
            task.failure = why or "no result before the deadline"
            move_phase(task, TaskPhase.FAILED)
            self._count("tasks_failed")
            effects.append(Emit("task.failed", {"task_id": tid.hex(), "why": task.failure}))
        effects.append(self._updated(task))
        return effects
