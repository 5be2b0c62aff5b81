"""Requester side of the task market: beacon, collect bids, select, assign, replan, vote.

For each task submitted with ``SubmitTask`` the auction promises:
* a signed beacon on ``BEACON_TOPIC``; the bid window closes as soon as waiting cannot improve
  the choice (protocol/market/bidding.py: ``wanted + spare_bids`` bids in, every possible
  bidder in, or ``close_grace_ms`` after the wanted count) or when ``bid_window_ms`` passes
  (a deadline, never a sleep);
* the selector (score or LinUCB) picks the executors; never two attempts for one peer on one
  task, never the requester itself unless the task allows it;
* each assigned executor gets a deadline (``assign_base_ms + slack * its estimated latency``,
  capped by the task's); an executor that misses it, disconnects, refuses, is unreachable or
  answers malformed is attested, excluded and replaced from the spare bids still held, or by a
  new beacon round, while the task's deadline leaves time (``max_rounds``, ``min_round_ms``);
* results are kept as they arrive; with ``k`` results, or at the deadline with at least one
  (``partial``), the answers are combined by protocol.market.voting; with none the task fails;
* forged, replayed, late, oversized or unsolicited bids and results are rejected and counted
  in ``counters`` (and penalized where a peer is clearly at fault); a peer sending more than
  ``bid_rate`` bids per ``rate_window_ms`` is rate-limited; results for unknown tasks are
  dropped.

The machine never reads the ledger: reputations come from the ``reputation`` callback, and
how many peers could bid on a task from ``possible_bidders`` (the bid window closes early once
all of them have; protocol/market/bidding.py). Its
own effects: ``TaskUpdated`` (store/show the snapshot), ``Attest`` (an observation the node
turns into a signed ledger attestation). ``Reward`` feeds later rewards (e.g. verification)
to the selector. Seam for verification: every result that passes the checks goes through
``Auction.admit(task, result, now)``; a commit/reveal step wraps it.

Beacons and bids are handled by the bidding half (protocol/market/bidding.py), results and
the vote by the result half (protocol/market/results.py); this module holds the task's life
around them: submit, restore, failures, replanning and timers.
"""

from __future__ import annotations

from collections.abc import Callable
from random import Random

from crypto.envelope import Envelope, EnvelopeError
from crypto.keys import Identity
from protocol.answers import AnswerType
from protocol.envelopes import open_envelope
from protocol.errors import InvalidMessage, LocalProtocolError
from protocol.machine import (
    Effect,
    Emit,
    PeerDisconnected,
    Penalize,
    Received,
    Send,
    SendFailed,
    Tick,
)
from protocol.market.bidding import Bidding, RateWindow
from protocol.market.events import (
    FAILED,
    TASK_ATTEST,
    TIMEOUT,
    Attest,
    AuctionConfig,
    CancelTask,
    KeptResult,
    RestoredAttempt,
    RestoreTask,
    Reward,
    SubmitTask,
    TaskUpdated,
)
from protocol.market.messages import (
    MAX_ROUND,
    MAX_TASK_MS,
    RESULT_DOMAIN,
    TASK_ID_LEN,
    Assign,
    Bid,
    BidBody,
    Cancel,
    Reject,
    Requirement,
    Result,
    ResultBody,
    TaskSpec,
)
from protocol.market.results import ResultIntake
from protocol.market.rounds import NextRound, RoundAction, RoundState, next_round
from protocol.market.sampling import default_temperature
from protocol.market.selection import Selector
from protocol.market.state import (
    Attempt,
    AttemptState,
    BidInfo,
    OpenTask,
    ResultInfo,
    TaskPhase,
    move_attempt,
    move_phase,
    snapshot,
)

__all__ = [
    "Attest", "Auction", "AuctionConfig", "CancelTask", "KeptResult", "RestoredAttempt",
    "RestoreTask", "Reward",
    "SubmitTask", "TaskUpdated",
]



class Auction(Bidding, ResultIntake):
    def __init__(
        self,
        identity: Identity,
        selector: Selector,
        rng: Random,
        config: AuctionConfig | None = None,
        reputation: Callable[[str], float] = lambda peer: 0.5,
        possible_bidders: Callable[[OpenTask], int | None] = lambda task: None,
    ) -> None:
        self.identity = identity
        self.peer = identity.peer_id
        self.selector = selector
        self.rng = rng
        self.config = config if config is not None else AuctionConfig()
        self.reputation = reputation
        self.possible_bidders = possible_bidders
        self.tasks: dict[bytes, OpenTask] = {}
        self.counters: dict[str, int] = {}
        self._rates: dict[str, RateWindow] = {}

    # ------------------------------------------------------------------ machine contract

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received):
            msg = event.message
            if isinstance(msg, Bid):
                return self._on_bid(event.peer, msg, now)
            if isinstance(msg, Result):
                return self._on_result(event.peer, msg, now)
            if isinstance(msg, Reject):
                return self._on_reject(event.peer, msg, now)
            return []
        if isinstance(event, Tick):
            return self._on_tick(now)
        if isinstance(event, SubmitTask):
            return self._submit(event, now)
        if isinstance(event, RestoreTask):
            return self._restore(event, now)
        if isinstance(event, SendFailed) and isinstance(event.message, Assign):
            return self._fail_peer(event.peer, f"unreachable: {event.reason}", now)
        if isinstance(event, PeerDisconnected) and self.config.fail_on_disconnect:
            return self._fail_peer(event.peer, "disconnected", now)
        if isinstance(event, CancelTask):
            task = self.tasks.get(event.task_id)
            return [] if task is None or task.finished else self._finish(task, now, "cancelled")
        if isinstance(event, Reward):
            self.selector.observe(event.task_id, event.peer, event.reward)
            return []
        return []

    def next_deadline(self) -> int | None:
        times: list[int] = []
        for t in self.tasks.values():
            if t.finished:
                times.append(t.forget_at_ms)
                continue
            times.append(t.deadline_at_ms)
            if t.next_round_at_ms is not None:
                times.append(t.next_round_at_ms)
            elif t.phase is TaskPhase.BIDDING:
                times.append(t.window_closes_at_ms)
            times.extend(a.due_at_ms for a in t.active)
        return min(times) if times else None

    # ------------------------------------------------------------------ helpers

    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    def _rejecter(self, scope: str, noun: str, peer: str) -> Callable[..., list[Effect]]:
        """``reject(why, penalty=0)`` for one incoming ``noun`` (e.g. "bid") from ``peer``:
        counts ``<noun>s_rejected.<why>``, emits ``<scope>.<noun>_rejected`` and, with a
        penalty, penalizes the peer."""

        def reject(why: str, penalty: int = 0) -> list[Effect]:
            self._count(f"{noun}s_rejected.{why}")
            out: list[Effect] = [Emit(f"{scope}.{noun}_rejected", {"peer": peer, "why": why})]
            if penalty:
                out.append(Penalize(peer, f"{noun} rejected: {why}", penalty))
            return out

        return reject

    def _updated(self, task: OpenTask) -> TaskUpdated:
        return TaskUpdated(snapshot(task))

    def open_tasks(self) -> list[OpenTask]:
        return [t for t in self.tasks.values() if not t.finished]

    # ------------------------------------------------------------------ submit and restore

    def _submit(self, ev: SubmitTask, now: int) -> list[Effect]:
        try:
            AnswerType(ev.answer_type)
        except ValueError:
            raise LocalProtocolError(f"unknown answer type {ev.answer_type!r}") from None
        if not 1 <= ev.deadline_ms <= MAX_TASK_MS:
            raise LocalProtocolError(f"deadline_ms must be in [1, {MAX_TASK_MS}]")
        task_id = ev.task_id if ev.task_id is not None else self.rng.randbytes(TASK_ID_LEN)
        if task_id in self.tasks:
            raise LocalProtocolError(f"task {task_id.hex()} exists already")
        spec = TaskSpec(
            task_id=task_id, requester=self.peer, question=ev.question,
            answer_type=ev.answer_type, choices=ev.choices,
            requirement=Requirement(model=ev.model, family=ev.family,
                                    min_context=ev.min_context),
            k=ev.k, max_price=ev.max_price, max_tokens=ev.max_tokens, style=ev.style,
            history=ev.history, top_p=ev.top_p, seed=ev.seed, stop=ev.stop,
            temperature=default_temperature(ev.k) if ev.temperature is None else ev.temperature,
        )
        try:
            spec.check()
        except ValueError as exc:
            raise LocalProtocolError(f"task: {exc}") from None
        task = OpenTask(spec=spec, allow_self=ev.allow_self, phase=TaskPhase.BIDDING,
                        created_at_ms=now, deadline_at_ms=now + ev.deadline_ms)
        self.tasks[task_id] = task
        self._count("tasks_submitted")
        if len(self.open_tasks()) > self.config.max_open_tasks:
            return self._finish(task, now, "too many open tasks")
        return [Emit("task.submitted", {"task_id": task_id.hex(), "k": ev.k}),
                *self._beacon(task, now)]

    def _restore(self, ev: RestoreTask, now: int) -> list[Effect]:
        spec = ev.spec
        if spec.task_id in self.tasks or spec.requester != self.peer:
            raise LocalProtocolError("restore of a task that is not ours or already known")
        task = OpenTask(spec=spec, allow_self=ev.allow_self, phase=TaskPhase.BIDDING,
                        created_at_ms=now, deadline_at_ms=now + max(0, ev.remaining_ms),
                        round=min(ev.round, MAX_ROUND), next_attempt=ev.next_attempt,
                        tried=set(ev.tried), rounds_with_bids=min(ev.round, MAX_ROUND) + 1)
        self.tasks[spec.task_id] = task
        for kept in ev.kept:
            try:
                env = Envelope.decode(kept.envelope)
                body = open_envelope(env, RESULT_DOMAIN, ResultBody, self.config.max_frame)
            except (InvalidMessage, EnvelopeError):
                continue  # a damaged row loses that result, not the task
            if body.task_id != spec.task_id or env.signer != body.executor:
                continue
            task.results[body.executor] = ResultInfo(body, env, body.attempt, kept.match_score,
                                                     now)
            task.tried.add(body.executor)
        for ra in ev.assigned:
            if ra.peer in task.results or ra.attempt in task.attempts:
                continue
            bid = BidBody(task_id=spec.task_id, round=task.round, bidder=ra.peer, model=ra.model,
                          model_hash=b"", match_score=ra.match_score, price=0.0,
                          est_latency_ms=0, load=0.0, free_slots=0, hold_ms=1)
            due = min(task.deadline_at_ms, now + max(0, ra.due_in_ms))
            task.attempts[ra.attempt] = Attempt(ra.attempt, ra.peer, BidInfo(bid, now, now),
                                                AttemptState.ASSIGNED, now, due)
            task.tried.add(ra.peer)
        task.next_attempt = max([task.next_attempt, *(a + 1 for a in task.attempts)])
        self._count("tasks_restored")
        if len(task.results) >= spec.k or ev.remaining_ms <= 0:
            return self._finish(task, now, "requester restarted after the deadline")
        return self._replan(task, now, after_close=True)

    # ------------------------------------------------------------------ failures and replan

    def _fail_attempt(self, task: OpenTask, attempt: Attempt, reason: str, outcome: str | None,
                      now: int, cancel: bool = True) -> list[Effect]:
        move_attempt(attempt, AttemptState.FAILED, reason)
        self._count(f"attempts_failed.{reason.split(':')[0]}")
        self.selector.observe(task.spec.task_id, attempt.peer, 0.0)
        effects: list[Effect] = [Emit("task.attempt_failed", {
            "task_id": task.spec.task_id.hex(), "peer": attempt.peer, "reason": reason})]
        if outcome is not None:
            effects.append(Attest(attempt.peer, task.spec.task_id, TASK_ATTEST, outcome, reason))
        if cancel:
            effects.append(Send(attempt.peer, Cancel(task_id=task.spec.task_id,
                                                     attempt=attempt.attempt)))
        return effects + self._replan(task, now)

    def _fail_peer(self, peer: str, reason: str, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for task in self.open_tasks():
            task.spares.pop(peer, None)
            for attempt in task.active:
                if attempt.peer == peer and not task.finished:
                    effects += self._fail_attempt(task, attempt, reason, FAILED, now, False)
        return effects

    def _replan(self, task: OpenTask, now: int, after_close: bool = False) -> list[Effect]:
        """Find executors for the shortfall: spares first, then a new beacon round.

        Finishes the task when nothing can bring another result: no attempt running, no bid
        window open and no round left (or no time for one).
        """
        if task.finished:
            return []
        effects: list[Effect] = []
        if task.needed > 0 and task.spares:
            effects += self._pick(task, task.spares, now)
        window_open = task.phase is TaskPhase.BIDDING and not after_close
        why = "no executor left"
        if task.needed > 0 and not window_open and task.next_round_at_ms is None:
            plan = self._plan_round(task, now)
            task.empty_rounds = plan.empty_rounds
            if plan.action is RoundAction.BEACON and plan.at_ms <= now:
                task.round += 1
                if task.phase is not TaskPhase.BIDDING:
                    move_phase(task, TaskPhase.BIDDING)
                self._count("replans")
                return effects + self._beacon(task, now)
            if plan.action is RoundAction.GIVE_UP:
                why = plan.why
            else:  # a round after a backoff, or a skipped one: the tick brings it
                if plan.action is RoundAction.SKIP:
                    task.last_round_at_ms = now
                    self._count("rounds_skipped")
                task.next_round_at_ms = plan.at_ms
        if window_open:
            return effects + [self._updated(task)]
        if not task.active and task.next_round_at_ms is None:
            return effects + self._finish(task, now, why)
        if task.phase is TaskPhase.BIDDING and task.active:
            move_phase(task, TaskPhase.RUNNING)
        return effects + [self._updated(task)]

    def _plan_round(self, task: OpenTask, now: int) -> NextRound:
        """The next round for ``task`` by protocol/market/rounds.py (the wire allows
        ``MAX_ROUND`` + 1 rounds in all)."""
        if task.round >= MAX_ROUND:
            return NextRound(RoundAction.GIVE_UP, why="no executor left",
                             empty_rounds=task.empty_rounds)
        possible = self.possible_bidders(task)
        c = self.config
        return next_round(RoundState(
            now_ms=now, deadline_at_ms=task.deadline_at_ms, last_round_at_ms=task.last_round_at_ms,
            rounds_with_bids=task.rounds_with_bids, empty_rounds=task.empty_rounds,
            tried=len(task.tried), untried=None if possible is None else max(0, possible - len(
                task.tried))), max_rounds=c.max_rounds, min_round_ms=c.min_round_ms,
            backoff_base_ms=c.backoff_base_ms, backoff_max_ms=c.backoff_max_ms)

    def _on_tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for task_id, task in list(self.tasks.items()):
            if task.finished:
                if now >= task.forget_at_ms:
                    del self.tasks[task_id]
                continue
            if now >= task.deadline_at_ms:
                effects += self._finish(task, now, "")
                continue
            for attempt in task.active:
                if now >= attempt.due_at_ms and not task.finished:
                    effects += self._fail_attempt(task, attempt, "timeout", TIMEOUT, now)
            if task.next_round_at_ms is not None:
                if now >= task.next_round_at_ms and not task.finished:
                    task.next_round_at_ms = None
                    effects += self._replan(task, now, after_close=True)
            elif task.phase is TaskPhase.BIDDING and now >= task.window_closes_at_ms \
                    and not task.finished:
                effects += self._close(task, now)
        return effects

