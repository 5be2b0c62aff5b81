"""Requester side of the task market: beacon, collect bids, select, assign, replan, vote.

For each task submitted with ``SubmitTask`` the auction promises:
* a signed beacon on ``BEACON_TOPIC``; the bid window closes as soon as ``wanted + spare_bids``
  valid bids are in, or when ``bid_window_ms`` passes (a deadline, never a sleep);
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

The machine never reads the ledger: reputations come from the ``reputation`` callback. Its
own effects: ``TaskUpdated`` (store/show the snapshot), ``Attest`` (an observation the node
turns into a signed ledger attestation). ``Reward`` feeds later rewards (e.g. verification)
to the selector. Seam for verification: every result that passes the checks goes through
``Auction.admit(task, result, now)``; a commit/reveal step wraps it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random

from crypto.envelope import Envelope, EnvelopeError
from crypto.keys import Identity
from protocol.answers import AnswerType
from protocol.envelopes import Unopened, open_authored, open_envelope, seal
from protocol.errors import InvalidMessage, LocalProtocolError
from protocol.machine import (
    Effect,
    Emit,
    PeerDisconnected,
    Penalize,
    Publish,
    Received,
    Send,
    SendFailed,
    Tick,
)
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
    ASSIGN_DOMAIN,
    BEACON_DOMAIN,
    BEACON_TOPIC,
    BID_DOMAIN,
    MAX_ROUND,
    MAX_TASK_MS,
    RESULT_DOMAIN,
    TASK_ID_LEN,
    Assign,
    AssignBody,
    Beacon,
    BeaconBody,
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
from protocol.market.selection import Candidate, Selector
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

PENALTY_FORGED = 20
PENALTY_RATE = 2


@dataclass
class _Rate:
    times: deque[int] = field(default_factory=deque)


class Auction(ResultIntake):
    def __init__(
        self,
        identity: Identity,
        selector: Selector,
        rng: Random,
        config: AuctionConfig | None = None,
        reputation: Callable[[str], float] = lambda peer: 0.5,
    ) -> None:
        self.identity = identity
        self.peer = identity.peer_id
        self.selector = selector
        self.rng = rng
        self.config = config if config is not None else AuctionConfig()
        self.reputation = reputation
        self.tasks: dict[bytes, OpenTask] = {}
        self.counters: dict[str, int] = {}
        self._rates: dict[str, _Rate] = {}

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
            if t.phase is TaskPhase.BIDDING:
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

    # ------------------------------------------------------------------ submit and beacons

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
            k=ev.k, max_price=ev.max_price, max_tokens=ev.max_tokens,
        )
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
                        tried=set(ev.tried))
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

    def _beacon(self, task: OpenTask, now: int) -> list[Effect]:
        remaining = task.deadline_at_ms - now
        window = max(1, min(self.config.bid_window_ms, remaining // 3))
        task.window_closes_at_ms = now + window
        task.bids.clear()
        spec = task.spec
        body = BeaconBody(
            task_id=spec.task_id, requester=self.peer, round=task.round,
            requirement=spec.requirement, wanted=max(1, task.needed), max_price=spec.max_price,
            max_tokens=spec.max_tokens, bid_window_ms=window, deadline_ms=max(1, remaining),
            allow_self=task.allow_self,
        )
        self._count("beacons_sent")
        return [
            Publish(BEACON_TOPIC, Beacon(envelope=seal(self.identity, BEACON_DOMAIN, body))),
            Emit("task.beacon", {"task_id": spec.task_id.hex(), "round": task.round,
                                 "wanted": body.wanted, "window_ms": window}),
            self._updated(task),
        ]

    # ------------------------------------------------------------------ bids

    def _rate_limited(self, peer: str, now: int) -> bool:
        rate = self._rates.setdefault(peer, _Rate())
        while rate.times and rate.times[0] <= now - self.config.rate_window_ms:
            rate.times.popleft()
        if len(rate.times) >= self.config.bid_rate:
            return True
        rate.times.append(now)
        if len(self._rates) > 4 * self.config.max_open_tasks * self.config.max_bids_per_task:
            for p in [p for p, r in self._rates.items() if not r.times]:
                del self._rates[p]
        return False

    def _on_bid(self, peer: str, msg: Bid, now: int) -> list[Effect]:
        reject = self._rejecter("task", "bid", peer)

        if self._rate_limited(peer, now):
            return reject("rate_limited", PENALTY_RATE)
        try:
            body = open_authored(msg.envelope, BID_DOMAIN, BidBody,
                                 self.config.max_frame, sender=peer, author=lambda b: b.bidder)
        except Unopened as refused:
            return reject(refused.why, PENALTY_FORGED)
        task = self.tasks.get(body.task_id)
        if task is None:
            return reject("unknown_task")
        if peer in task.bids or peer in task.tried or peer in task.spares:
            return reject("duplicate")

        def refuse(why: str) -> list[Effect]:
            # a valid bid we will not use: release the slot the bidder holds for it
            return reject(why) + [Send(peer, Cancel(task_id=body.task_id, attempt=-1))]

        if task.phase is not TaskPhase.BIDDING or body.round != task.round \
                or now >= task.window_closes_at_ms:
            return refuse("late")
        if peer == self.peer and not task.allow_self:
            return refuse("self")
        if body.price > task.spec.max_price:
            return refuse("over_budget")
        if body.match_score < self.config.min_match:
            return refuse("poor_match")
        if len(task.bids) >= self.config.max_bids_per_task:
            return refuse("too_many")
        task.bids[peer] = BidInfo(body, now, now + body.hold_ms)
        self._count("bids_accepted")
        effects: list[Effect] = [Emit("task.bid", {"task_id": body.task_id.hex(), "peer": peer,
                                                    "match": body.match_score,
                                                    "price": body.price})]
        if len(task.bids) >= task.needed + self.config.spare_bids:
            effects.extend(self._close(task, now))
        return effects

    def _candidate(self, task: OpenTask, info: BidInfo, now: int) -> Candidate:
        b = info.body
        return Candidate(
            peer=b.bidder, match_score=b.match_score, reputation=self.reputation(b.bidder),
            price=b.price, max_price=task.spec.max_price, est_latency_ms=b.est_latency_ms,
            deadline_ms=max(0, task.deadline_at_ms - now), load=b.load, free_slots=b.free_slots,
        )

    def _pick(self, task: OpenTask, pool: dict[str, BidInfo], now: int) -> list[Effect]:
        """Assign up to ``task.needed`` executors chosen from ``pool`` (which is consumed)."""
        usable = {p: b for p, b in pool.items() if p not in task.tried and now < b.hold_until_ms}
        chosen = self.selector.select(
            task.spec.task_id, [self._candidate(task, b, now) for b in usable.values()],
            task.needed,
        )
        effects: list[Effect] = []
        for c in chosen:
            info = usable.pop(c.peer, None)
            if info is not None and task.needed > 0:
                effects.extend(self._assign(task, info, now))
        pool.clear()
        pool.update(usable)
        return effects

    def _close(self, task: OpenTask, now: int) -> list[Effect]:
        """Close the bid window: assign from the bids, keep the rest as spares."""
        effects = self._pick(task, task.bids, now)
        task.spares.update(task.bids)
        task.bids.clear()
        self._count("auctions_closed")
        return effects + self._replan(task, now, after_close=True)

    def _assign(self, task: OpenTask, info: BidInfo, now: int) -> list[Effect]:
        b = info.body
        due = now + self.config.assign_base_ms + int(self.config.assign_slack *
                                                      b.est_latency_ms)
        due = min(due, task.deadline_at_ms)
        attempt = Attempt(task.next_attempt, b.bidder, info, AttemptState.ASSIGNED, now, due)
        task.next_attempt += 1
        task.attempts[attempt.attempt] = attempt
        task.tried.add(b.bidder)
        if task.first_assigned_at_ms is None:
            task.first_assigned_at_ms = now
        body = AssignBody(task=task.spec, executor=b.bidder, attempt=attempt.attempt,
                          round=task.round, model=b.model, deadline_ms=max(1, due - now))
        self._count("assigned")
        return [
            Send(b.bidder, Assign(envelope=seal(self.identity, ASSIGN_DOMAIN, body))),
            Emit("task.assigned", {"task_id": task.spec.task_id.hex(), "peer": b.bidder,
                                   "attempt": attempt.attempt, "due_in_ms": due - now}),
        ]

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
        if task.needed > 0 and not window_open:
            rounds_left = task.round + 1 < min(self.config.max_rounds, MAX_ROUND + 1)
            if rounds_left and task.deadline_at_ms - now >= self.config.min_round_ms:
                task.round += 1
                if task.phase is not TaskPhase.BIDDING:
                    move_phase(task, TaskPhase.BIDDING)
                self._count("replans")
                return effects + self._beacon(task, now)
        if window_open:
            return effects + [self._updated(task)]
        if not task.active:
            return effects + self._finish(task, now, "no executor left")
        if task.phase is TaskPhase.BIDDING:
            move_phase(task, TaskPhase.RUNNING)
        return effects + [self._updated(task)]

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
            if task.phase is TaskPhase.BIDDING and now >= task.window_closes_at_ms \
                    and not task.finished:
                effects += self._close(task, now)
        return effects

