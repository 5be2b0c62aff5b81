"""Requester side of the task market: beacon, collect bids, select, assign, replan, vote.

For each task submitted with ``SubmitTask`` the auction promises:
* a signed beacon on ``BEACON_TOPIC``; the bid window closes as soon as waiting cannot improve
  the choice (protocol/market/bidding.py: every possible bidder in, or, unless a better
  match may still come, ``wanted + spare_bids`` bids in or ``close_grace_ms`` after the
  wanted count) or when ``bid_window_ms`` passes
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

A task that names a need (protocol/agents/wire.py: text, skill tags, an agent) is matched
from agent cards: ``agent_match(peer, agent, requirement)`` gives the match of the card the
requester's ledger holds for the bid's (peer, agent), never the bid's claim; a bid for which
it knows no card is refused (counted as ``bids_rejected.no_card``), and a task naming an agent
takes only that agent's bids. A task that names none keeps the model rule (the bid's model
match: 1 by name, 0.75 by family, 0.5 for any). That match is what the selector ranks (score,
LinUCB features) and what weighs the executor's ballot. Selectors key their arms by peer: a
node hosting several agents bids once per task, with its best-fitting one
(protocol/market/offers.py), so a peer stands for one agent per task.

The machine never reads the ledger: what it asks of its node (reputations, how many peers
could bid on a task, which peers never to pick, the vote's rule, agent-card matches) comes in
one ``AuctionOptions`` record (protocol/market/options.py), which the daemon
(node/market/requester.py) and the simulator (simulations/machines/market.py) pass the same way.
Its own effects: ``TaskUpdated`` (store/show the snapshot), ``Attest`` (an observation the node
turns into a signed ledger attestation). ``Reward`` feeds later rewards (e.g. verification) to
the selector.

``Auction`` owns the task table and the counters and holds two components it calls:
``Bidding`` (protocol/market/bidding.py: beacons, bid checks, picking and assigning) and
``ResultIntake`` (protocol/market/results.py: result checks, the vote). Tasks are built by
protocol/market/tasks.py; this module holds the task's life around them: submit, restore,
failures, replanning and timers. Seam for verification: ``check_result`` and ``admit`` are
public, so ``protocol.verification.requester.VerifiedAuction``, which holds an ``Auction``,
checks a revealed result as the auction does and then decides itself whether to admit it.
"""

from __future__ import annotations

from random import Random

from crypto.keys import Identity
from protocol.codec import Message
from protocol.machine import (
    Effect,
    Emit,
    OnMessage,
    PeerDisconnected,
    Received,
    Send,
    SendFailed,
    Tick,
    on_received,
)
from protocol.market.bidding import Bidding, BidNext
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
from protocol.market.messages import MAX_ROUND, Assign, Bid, Cancel, Reject, RejectReason, Result
from protocol.market.options import AuctionOptions
from protocol.market.progress import Progress, ProgressBook
from protocol.market.refusals import count
from protocol.market.results import ResultIntake
from protocol.market.rounds import NextRound, RoundAction, RoundState, next_round
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
from protocol.market.tasks import restored_task, submitted_task
from protocol.market.voting import VoteRule

__all__ = [
    "Attest", "Auction", "AuctionConfig", "AuctionOptions", "CancelTask", "KeptResult",
    "RestoredAttempt", "RestoreTask", "Reward", "SubmitTask", "TaskUpdated", "VoteRule",
]


class Auction:
    def __init__(self, identity: Identity, selector: Selector, rng: Random,
                 config: AuctionConfig | None = None,
                 options: AuctionOptions | None = None) -> None:
        """``options``: what the auction asks of its node (protocol/market/options.py)."""
        self.identity = identity
        self.peer = identity.peer_id
        self.selector = selector
        self.rng = rng
        self.config = config if config is not None else AuctionConfig()
        self.options = options if options is not None else AuctionOptions()
        self.tasks: dict[bytes, OpenTask] = {}
        self.counters: dict[str, int] = {}
        self.progress = ProgressBook(counters=self.counters)  # k=1 tasks' streamed text
        self.bidding = Bidding(identity, self.config, selector, self.options, self.counters)
        self.intake = ResultIntake(self.config, selector, self.options, self.counters)
        self._on_message: dict[type[Message], OnMessage] = {
            Bid: self._on_bid, Result: self._on_result, Reject: self._on_reject,
            Progress: lambda peer, msg, now: self.progress.accept(peer, msg, self.tasks),
        }

    # ------------------------------------------------------------------ machine contract

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received):
            return on_received(self._on_message, event, now)
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
            return [] if task is None or task.finished else self.finish(task, now, "cancelled")
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

    def open_tasks(self) -> list[OpenTask]:
        return [t for t in self.tasks.values() if not t.finished]

    # ------------------------------------------------------------------ submit and restore

    def _submit(self, ev: SubmitTask, now: int) -> list[Effect]:
        task = submitted_task(ev, self.peer, self.tasks, self.rng, now)
        self.tasks[task.spec.task_id] = task
        count(self.counters, "tasks_submitted")
        if len(self.open_tasks()) > self.config.max_open_tasks:
            return self.finish(task, now, "too many open tasks")
        return [Emit("task.submitted", {"task_id": task.spec.task_id.hex(), "k": ev.k}),
                *self.bidding.beacon(task, now)]

    def _restore(self, ev: RestoreTask, now: int) -> list[Effect]:
        task = restored_task(ev, self.peer, self.tasks, self.config.max_frame, now)
        self.tasks[task.spec.task_id] = task
        count(self.counters, "tasks_restored")
        if len(task.results) >= task.spec.k or ev.remaining_ms <= 0:
            return self.finish(task, now, "requester restarted after the deadline")
        return self._replan(task, now, after_close=True)

    # ------------------------------------------------------------------ bids

    def _on_bid(self, peer: str, msg: Bid, now: int) -> list[Effect]:
        taken = self.bidding.take(peer, msg, self.tasks, now)
        if isinstance(taken, list):
            return taken
        task = taken.task
        if taken.next is BidNext.CLOSE:
            return taken.effects + self._close(task, now)
        if taken.next is BidNext.SPARE:  # used at once while the task lacks executors
            return taken.effects + self._replan(task, now,
                                                after_close=now >= task.window_closes_at_ms)
        return taken.effects

    def _close(self, task: OpenTask, now: int) -> list[Effect]:
        """Close the bid window: assign from the bids, keep the rest as spares."""
        if task.bids:
            task.rounds_with_bids += 1
            task.empty_rounds = 0
        else:
            task.empty_rounds += 1
        task.last_round_at_ms = now
        effects = self.bidding.pick(task, task.bids, now)
        task.spares.update(task.bids)
        task.bids.clear()
        count(self.counters, "auctions_closed")
        return effects + self._replan(task, now, after_close=True)

    # ------------------------------------------------------------------ results

    def _on_reject(self, peer: str, msg: Reject, now: int) -> list[Effect]:
        task = self.tasks.get(msg.task_id)
        attempt = task.attempts.get(msg.attempt) if task is not None else None
        if task is None or attempt is None or attempt.peer != peer \
                or attempt.state is not AttemptState.ASSIGNED:
            count(self.counters, "rejects_ignored")
            return []
        outcome = FAILED if msg.reason is RejectReason.COMPUTE_FAILED else None
        return self.fail_attempt(task, attempt, f"rejected:{msg.reason.value}", outcome, now,
                                 cancel=False)

    def _on_result(self, peer: str, msg: Result, now: int) -> list[Effect]:
        checked = self.check_result(peer, msg, now)
        if isinstance(checked, list):
            return checked
        return self.admit(self.tasks[checked.body.task_id], checked, now)

    def check_result(self, peer: str, msg: Result, now: int) -> ResultInfo | list[Effect]:
        """The result checks (protocol/market/results.py): the checked result, or the
        refusal's effects, the attempt it fails included."""
        checked = self.intake.check(peer, msg, self.tasks, now)
        if isinstance(checked, ResultInfo):
            return checked
        f = checked.failure
        if f is None:
            return checked.effects
        return checked.effects + self.fail_attempt(f.task, f.attempt, f.reason, f.outcome, now,
                                                   cancel=f.cancel)

    def admit(self, task: OpenTask, result: ResultInfo, now: int) -> list[Effect]:
        """Keep a checked result; vote once ``k`` are in."""
        attempt = task.attempts[result.attempt]
        move_attempt(attempt, AttemptState.ANSWERED)
        task.results[attempt.peer] = result
        count(self.counters, "results_accepted")
        effects = self.progress.judge(task.spec.task_id, attempt.peer, result.attempt,
                                      result.body.cot)
        effects.append(Emit("task.result", {
            "task_id": task.spec.task_id.hex(), "peer": attempt.peer,
            "answer": result.body.answer, "latency_ms": now - attempt.assigned_at_ms}))
        if len(task.results) >= task.spec.k:
            return effects + self.finish(task, now, "")
        if not task.active and task.phase is TaskPhase.RUNNING:
            return effects + self._replan(task, now)
        effects.append(TaskUpdated(snapshot(task)))
        return effects

    def finish(self, task: OpenTask, now: int, why: str) -> list[Effect]:
        """Vote and end ``task`` (protocol/market/results.py); ``why`` a failure's reason."""
        return self.intake.finish(task, now, why)

    # ------------------------------------------------------------------ failures and replan

    def fail_attempt(self, task: OpenTask, attempt: Attempt, reason: str, outcome: str | None,
                     now: int, cancel: bool = True) -> list[Effect]:
        """Fail a running attempt (attested when ``outcome``), then replan its task."""
        move_attempt(attempt, AttemptState.FAILED, reason)
        count(self.counters, f"attempts_failed.{reason.split(':')[0]}")
        self.selector.observe(task.spec.task_id, attempt.peer, 0.0)
        effects: list[Effect] = [Emit("task.attempt_failed", {
            "task_id": task.spec.task_id.hex(), "peer": attempt.peer, "reason": reason})]
        # a replacement streams its own text from the start: this attempt's is discarded
        effects += self.progress.discard(task.spec.task_id, attempt.attempt)
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
                    effects += self.fail_attempt(task, attempt, reason, FAILED, now, False)
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
            effects += self.bidding.pick(task, task.spares, now)
        window_open = task.phase is TaskPhase.BIDDING and not after_close
        why = "no executor left"
        if task.needed > 0 and not window_open and task.next_round_at_ms is None:
            plan = self._plan_round(task, now)
            task.empty_rounds = plan.empty_rounds
            if plan.action is RoundAction.BEACON and plan.at_ms <= now:
                task.round += 1
                if task.phase is not TaskPhase.BIDDING:
                    move_phase(task, TaskPhase.BIDDING)
                count(self.counters, "replans")
                return effects + self.bidding.beacon(task, now)
            if plan.action is RoundAction.GIVE_UP:
                why = plan.why
            else:  # a round after a backoff, or a skipped one: the tick brings it
                if plan.action is RoundAction.SKIP:
                    task.last_round_at_ms = now
                    count(self.counters, "rounds_skipped")
                task.next_round_at_ms = plan.at_ms
        if window_open:
            return effects + [TaskUpdated(snapshot(task))]
        if not task.active and task.next_round_at_ms is None:
            return effects + self.finish(task, now, why)
        if task.phase is TaskPhase.BIDDING and task.active:
            move_phase(task, TaskPhase.RUNNING)
        return effects + [TaskUpdated(snapshot(task))]

    def _plan_round(self, task: OpenTask, now: int) -> NextRound:
        """The next round for ``task`` by protocol/market/rounds.py (the wire allows
        ``MAX_ROUND`` + 1 rounds in all)."""
        if task.round >= MAX_ROUND:
            return NextRound(RoundAction.GIVE_UP, why="no executor left",
                             empty_rounds=task.empty_rounds)
        possible = self.options.possible_bidders(task)
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
                    self.progress.forget(task_id)
                continue
            if now >= task.deadline_at_ms:
                effects += self.finish(task, now, "")
                continue
            for attempt in task.active:
                if now >= attempt.due_at_ms and not task.finished:
                    effects += self.fail_attempt(task, attempt, "timeout", TIMEOUT, now)
            if task.next_round_at_ms is not None:
                if now >= task.next_round_at_ms and not task.finished:
                    task.next_round_at_ms = None
                    effects += self._replan(task, now, after_close=True)
            elif task.phase is TaskPhase.BIDDING and now >= task.window_closes_at_ms \
                    and not task.finished:
                effects += self._close(task, now)
        return effects
