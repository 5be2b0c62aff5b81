"""Executor side of the task market: bid on matching beacons, run assigned tasks, return results.

Promises:
* bids only on beacons it can verify (signed by the requester they name), once per
  (task, round), only with a model that matches the requirement (and, hosting ``agents``,
  with its agent that fits the task best, protocol/market/offers.py) and a price within the
  requester's budget, and never beyond its ``slots`` plus ``queue`` places: a bid holds a
  place (RESERVED) for ``hold_ms``, after which it is released; an accepted assignment runs
  at once when one of the ``slots`` is free, else waits its turn (QUEUED, earliest deadline
  first), and its bid's estimated latency counted the wait (protocol/market/latency.py);
* accepts an assignment only if it is signed by the task's requester, sent by that requester,
  addressed to this node, for a task it bid on and still holds a reservation for (or one
  whose hold lapsed unassigned, while a place is free again), within its limits (question
  length, tokens, deadline); it answers anything else with a ``Reject``;
* runs at most one attempt per task; computation is the driver's job: ``StartCompute`` out,
  ``ComputeDone`` / ``ComputeFailed`` / ``ComputeProgress`` back (``CancelCompute`` when it is
  no longer wanted); sends a k=1 task's text as it grows (``Progress``, unsigned,
  protocol/market/progress.py), the signed ``Result`` only while the deadline has not passed.

Seam for verification (commit/reveal): a finished computation goes through
``Executor.deliver(job, body)``, which here sends the result at once; a commit/reveal step
replaces that method (send a commitment, keep ``body`` until the reveal is asked for). Job
states and their legal transitions are in protocol/market/jobs.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from crypto.keys import Identity
from protocol.agents.cards import AgentCard
from protocol.codec import MAX_FRAME_BYTES, Message
from protocol.envelopes import PENALTY_FORGED, open_envelope, seal
from protocol.errors import InvalidMessage, LocalProtocolError
from protocol.machine import Effect, Emit, OnMessage, Penalize, Received, Send, Tick, on_received
from protocol.market.events import CancelCompute, ComputeDone, ComputeFailed, StartCompute
from protocol.market.jobs import BUSY_STATES, Job, JobState, move_job, startable
from protocol.market.latency import LatencyModel, ahead_of
from protocol.market.messages import (
    ASSIGN_DOMAIN,
    BEACON_DOMAIN,
    BID_DOMAIN,
    COT_TRUNCATION_MARK,
    MAX_CONTEXT,
    MAX_COT_CHARS,
    MAX_QUESTION_CHARS,
    RESULT_DOMAIN,
    Assign,
    AssignBody,
    Beacon,
    BeaconBody,
    Bid,
    BidBody,
    Cancel,
    Reject,
    RejectReason,
    Result,
    ResultBody,
)
from protocol.market.offers import (
    MATCH_ANY,
    MATCH_EXACT,
    MATCH_FAMILY,
    ServedModel,
    best_offer,
    match_score,
)
from protocol.market.progress import ComputeProgress, ProgressSender

__all__ = ["MATCH_ANY", "MATCH_EXACT", "MATCH_FAMILY", "CancelCompute", "ComputeDone",
           "ComputeFailed", "Executor", "ExecutorConfig", "ServedModel", "StartCompute",
           "match_score"]

DEFAULT_HOLD_MS = 5_000
DEFAULT_MAX_TOKENS = 1_024
DEFAULT_MAX_TASK_MS = 10 * 60 * 1000
DEFAULT_QUEUE = 4
#: a job still running this long after its deadline is cancelled
OVERRUN_GRACE_MS = 1_000
#: how long finished jobs and seen beacons are remembered (replay protection)
REMEMBER_MS = 10 * 60 * 1000
MAX_REMEMBERED = 4_096


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    models: tuple[ServedModel, ...]
    #: tasks computed at once; each bid holds one slot (or queue place) for hold_ms
    slots: int = 1
    #: assignments that may wait for a busy slot, earliest deadline first: a busy executor
    #: still bids, its estimated latency counting the wait, so concurrent asks queue
    queue: int = DEFAULT_QUEUE
    hold_ms: int = DEFAULT_HOLD_MS
    max_question_chars: int = MAX_QUESTION_CHARS
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_task_ms: int = DEFAULT_MAX_TASK_MS
    max_cot_chars: int = MAX_COT_CHARS
    max_frame: int = MAX_FRAME_BYTES
    #: the node's own agent cards, in the operator's order (empty: bid as a bare model)
    agents: tuple[AgentCard, ...] = ()
    #: (agent, ms) its tools may add to a task within the operator's bounds: in its bids' latency
    tool_ms: tuple[tuple[str, int], ...] = ()


class Executor:
    def __init__(self, identity: Identity, config: ExecutorConfig) -> None:
        if config.slots < 1:
            raise LocalProtocolError("an executor needs at least one slot")
        self.identity = identity
        self.peer = identity.peer_id
        self.config = config
        self.jobs: dict[bytes, Job] = {}
        #: (task id, round) -> forget-at, for beacon dedup
        self.seen: dict[tuple[bytes, int], int] = {}
        self.counters: dict[str, int] = {}
        self.latency = LatencyModel()  # the estimate a bid carries, learned from past tasks
        self.progress = ProgressSender()
        self._on_message: dict[type[Message], OnMessage] = {
            Beacon: self._on_beacon, Assign: self._on_assign, Cancel: self._on_cancel}

    # ------------------------------------------------------------------ machine contract

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received):
            return on_received(self._on_message, event, now)
        if isinstance(event, ComputeDone):
            return self._on_done(event, now)
        if isinstance(event, ComputeFailed):
            return self._on_failed(event, now)
        if isinstance(event, ComputeProgress):
            return self.progress.frame(self.jobs, event)
        if isinstance(event, Tick):
            return self._on_tick(now)
        return []

    def next_deadline(self) -> int | None:
        times = [j.until_ms for j in self.jobs.values()]
        times.extend(self.seen.values())
        return min(times) if times else None

    # ------------------------------------------------------------------ queries

    def busy(self) -> int:
        return sum(1 for j in self.jobs.values() if j.state in BUSY_STATES)

    def free_slots(self) -> int:
        return max(0, self.config.slots - self.busy())

    # ------------------------------------------------------------------ helpers

    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    def _reject(self, peer: str, task_id: bytes, attempt: int, reason: RejectReason,
                detail: str) -> list[Effect]:
        self._count(f"assign_rejected.{reason.value}")
        return [
            Send(peer, Reject(task_id=task_id, attempt=attempt, reason=reason, detail=detail)),
            Emit("task.assign_rejected", {"task_id": task_id.hex(), "peer": peer,
                                          "reason": reason.value, "detail": detail}),
        ]

    def _move(self, job: Job, to: JobState, until_ms: int) -> None:
        if job.state is JobState.RESERVED:  # the bid won an assignment, or it did not
            self.latency.reservation_ended(won=to in (JobState.QUEUED, JobState.RUNNING))
        move_job(job, to, until_ms)

    # ------------------------------------------------------------------ beacons -> bids

    def _on_beacon(self, origin: str, msg: Beacon, now: int) -> list[Effect]:
        try:
            body = open_envelope(msg.envelope, BEACON_DOMAIN, BeaconBody, self.config.max_frame)
        except InvalidMessage as exc:
            self._count("beacon_rejected.invalid")
            return [Penalize(origin, f"invalid beacon: {exc}", PENALTY_FORGED)]
        if msg.envelope.signer != body.requester:
            self._count("beacon_rejected.forged")
            return [Penalize(origin, "beacon signed by another peer than its requester",
                             PENALTY_FORGED)]
        key = (body.task_id, body.round)
        if key in self.seen:
            self._count("beacon_duplicate")
            return []
        self.seen[key] = now + REMEMBER_MS
        if len(self.seen) > MAX_REMEMBERED:
            del self.seen[min(self.seen, key=lambda k: self.seen[k])]
        if body.requester == self.peer and not body.allow_self:
            return []
        return self._maybe_bid(body, now)

    def _maybe_bid(self, body: BeaconBody, now: int) -> list[Effect]:
        def skip(why: str) -> list[Effect]:
            self._count(f"beacon_skipped.{why}")
            return [Emit("task.beacon_skipped", {"task_id": body.task_id.hex(), "why": why})]

        existing = self.jobs.get(body.task_id)
        if existing is not None and (existing.state is not JobState.RELEASED
                                     or existing.attempt >= 0):
            return skip("already_bid")  # or already ran it: one attempt per task
        if self.busy() >= self.config.slots + self.config.queue:
            return skip("no_slot")
        if body.max_tokens > self.config.max_tokens or body.deadline_ms > self.config.max_task_ms:
            return skip("over_limits")
        offer = best_offer(body.requirement, self.config.models, self.config.agents)
        if offer is None:
            return skip("no_model")
        model, score = offer.model, offer.score
        price = model.price_per_1k * body.max_tokens / 1000.0
        if price > body.max_price:
            return skip("too_cheap")
        est_latency = dict(self.config.tool_ms).get(offer.agent, 0) + self.latency.estimate_ms(
            body.max_tokens, model.tokens_per_s, ahead_of(self.jobs.values(), self.config.slots), now)
        if est_latency > body.deadline_ms:
            return skip("too_slow")
        hold = min(self.config.hold_ms, body.deadline_ms)
        self.jobs[body.task_id] = Job(
            task_id=body.task_id, requester=body.requester, round=body.round,
            model=model.name, state=JobState.RESERVED, until_ms=now + hold, agent=offer.agent)
        bid = BidBody(
            task_id=body.task_id, round=body.round, bidder=self.peer, model=model.name,
            model_hash=model.model_hash, match_score=score, price=price,
            est_latency_ms=min(est_latency, 2**31), load=min(1.0, self.busy() / self.config.slots),
            free_slots=self.free_slots(), hold_ms=hold, agent=offer.agent)
        self._count("bids_sent")
        return [
            Send(body.requester, Bid(envelope=seal(self.identity, BID_DOMAIN, bid))),
            Emit("task.bid_sent", {"task_id": body.task_id.hex(), "requester": body.requester,
                                   "model": model.name, "agent": offer.agent, "match": score,
                                   "price": price}),
        ]

    # ------------------------------------------------------------------ assignments

    def _on_assign(self, peer: str, msg: Assign, now: int) -> list[Effect]:
        try:
            body = open_envelope(msg.envelope, ASSIGN_DOMAIN, AssignBody, self.config.max_frame)
        except InvalidMessage as exc:
            self._count("assign_rejected.invalid")
            return [Penalize(peer, f"invalid assignment: {exc}", PENALTY_FORGED)]
        task = body.task
        if msg.envelope.signer != task.requester or peer != task.requester:
            return [Penalize(peer, "assignment not signed and sent by its requester",
                             PENALTY_FORGED),
                    *self._reject(peer, task.task_id, body.attempt, RejectReason.BAD_ASSIGN,
                                  "not signed and sent by the requester")]
        if body.executor != self.peer:
            return self._reject(peer, task.task_id, body.attempt, RejectReason.BAD_ASSIGN,
                                "addressed to another executor")
        job = self.jobs.get(task.task_id)
        if job is None:
            return self._reject(peer, task.task_id, body.attempt, RejectReason.NOT_BID,
                                "no bid for this task")
        if job.state in (JobState.RUNNING, JobState.QUEUED) and job.attempt == body.attempt:
            self._count("assign_duplicate")
            return []  # a retransmission of what we already run
        if job.state is JobState.RELEASED and job.attempt < 0 \
                and job.requester == task.requester and self.busy() < self.config.slots \
                + self.config.queue:  # its hold lapsed before the assignment came: a loaded
            # network is seconds slow to deliver, so it is taken up again while a place is free
            job = self.jobs[task.task_id] = Job(
                task_id=task.task_id, requester=job.requester, round=job.round,
                model=job.model, state=JobState.RESERVED, until_ms=now + 1, agent=job.agent)
        if job.state is not JobState.RESERVED:
            reason = RejectReason.EXPIRED if job.state is JobState.RELEASED else \
                RejectReason.DUPLICATE
            return self._reject(peer, task.task_id, body.attempt, reason,
                                f"task is {job.state.value} here")
        if job.requester != task.requester:
            return self._reject(peer, task.task_id, body.attempt, RejectReason.BAD_ASSIGN,
                                "bid was for another requester")
        prompt_chars = len(task.question) + sum(len(t.content) for t in task.history)
        if (prompt_chars > self.config.max_question_chars
                or task.max_tokens > self.config.max_tokens
                or body.deadline_ms > self.config.max_task_ms):
            self._move(job, JobState.RELEASED, now + REMEMBER_MS)
            return self._reject(peer, task.task_id, body.attempt, RejectReason.OVER_LIMITS,
                                "question, tokens or deadline over this executor's limits")
        if body.model not in {m.name for m in self.config.models} or body.agent != job.agent:
            self._move(job, JobState.RELEASED, now + REMEMBER_MS)
            return self._reject(peer, task.task_id, body.attempt, RejectReason.BAD_ASSIGN,
                                f"model {body.model!r} or agent {body.agent!r} not the bid's")
        job.attempt, job.task, job.model, job.stream = body.attempt, task, body.model, body.stream
        job.deadline_at_ms = now + body.deadline_ms
        self._move(job, JobState.QUEUED, job.deadline_at_ms)
        self._count("assign_accepted")
        return [
            *self._start_queued(),
            Emit("task.assign_accepted", {"task_id": task.task_id.hex(), "attempt": body.attempt,
                                          "requester": peer, "model": body.model}),
        ]

    def _start_queued(self) -> list[Effect]:
        """Start queued assignments while compute slots are free (jobs.startable)."""
        effects: list[Effect] = []
        for job in startable(self.jobs, self.config.slots):
            self._move(job, JobState.RUNNING, job.deadline_at_ms + OVERRUN_GRACE_MS)
            if job.task is not None:  # always set once assigned
                effects.append(StartCompute(task=job.task, attempt=job.attempt,
                                            model=job.model, deadline_at_ms=job.deadline_at_ms,
                                            agent=job.agent, stream=job.stream))
        return effects

    def _on_cancel(self, peer: str, msg: Cancel, now: int) -> list[Effect]:
        job = self.jobs.get(msg.task_id)
        if job is None or peer != job.requester or job.state not in BUSY_STATES:
            return []
        if msg.attempt not in (-1, job.attempt):
            return []
        effects: list[Effect] = []
        if job.state is JobState.RUNNING:
            effects.append(CancelCompute(job.task_id, job.attempt))
        self._move(job, JobState.RELEASED, job.until_ms + REMEMBER_MS)
        self._count("cancelled")
        effects.append(Emit("task.cancelled", {"task_id": msg.task_id.hex()}))
        return effects + self._start_queued()

    # ------------------------------------------------------------------ results

    def _running(self, task_id: bytes, attempt: int) -> Job | None:
        job = self.jobs.get(task_id)
        ok = job is not None and job.state is JobState.RUNNING and job.attempt == attempt
        return job if ok else None

    def _on_done(self, ev: ComputeDone, now: int) -> list[Effect]:
        job = self._running(ev.task_id, ev.attempt)
        if job is None:
            return [Emit("task.compute_orphaned", {"task_id": ev.task_id.hex()})]
        tps = max((m.tokens_per_s for m in self.config.models if m.name == job.model), default=0)
        self.latency.task_done(ev.tokens, ev.compute_ms, tps, now)
        if now > job.deadline_at_ms:
            self._move(job, JobState.FAILED, now + REMEMBER_MS)
            self._count("results_late")
            return [Emit("task.result_late", {"task_id": ev.task_id.hex(),
                                              "late_ms": now - job.deadline_at_ms}),
                    *self._start_queued()]
        cot = ev.cot
        if len(cot) > self.config.max_cot_chars:
            cut = self.config.max_cot_chars - len(COT_TRUNCATION_MARK)
            cot = cot[:max(0, cut)] + COT_TRUNCATION_MARK
        body = ResultBody(
            task_id=ev.task_id, attempt=ev.attempt, executor=self.peer, answer=ev.answer[:1024],
            cot=cot, confidence=min(1.0, max(0.0, ev.confidence)), tokens=max(0, ev.tokens),
            compute_ms=max(0, ev.compute_ms), model_hash=ev.model_hash, adapter=ev.adapter,
            fingerprints=ev.fingerprints, fingerprint_root=ev.fingerprint_root,
            prompt_tokens=min(MAX_CONTEXT, max(0, ev.prompt_tokens)),
            finish_reason="length" if ev.finish_reason == "length" else "stop",
            agent=job.agent, tool_calls=ev.tool_calls, system_prompt=ev.system_prompt)
        self._move(job, JobState.DONE, now + REMEMBER_MS)
        self._count("results_sent")
        return self.deliver(job, body) + self._start_queued()

    def deliver(self, job: Job, body: ResultBody) -> list[Effect]:
        """Send a finished result to its requester (the commit/reveal seam, see top)."""
        return [
            Send(job.requester, Result(envelope=seal(self.identity, RESULT_DOMAIN, body))),
            Emit("task.result_sent", {"task_id": body.task_id.hex(), "answer": body.answer,
                                      "tokens": body.tokens, "compute_ms": body.compute_ms}),
        ]

    def _on_failed(self, ev: ComputeFailed, now: int) -> list[Effect]:
        job = self._running(ev.task_id, ev.attempt)
        if job is None:
            return []
        self._move(job, JobState.FAILED, now + REMEMBER_MS)
        return self._reject(job.requester, ev.task_id, ev.attempt, RejectReason.COMPUTE_FAILED,
                            ev.reason[:128]) + self._start_queued()

    # ------------------------------------------------------------------ timers

    def _on_tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for task_id, job in list(self.jobs.items()):
            if now < job.until_ms:
                continue
            if job.state is JobState.RESERVED:
                self._move(job, JobState.RELEASED, now + REMEMBER_MS)
                self._count("reservations_expired")
                effects.append(Emit("task.reservation_expired", {"task_id": task_id.hex()}))
            elif job.state is JobState.RUNNING:
                self._move(job, JobState.FAILED, now + REMEMBER_MS)
                self._count("jobs_overran")
                effects.append(CancelCompute(task_id, job.attempt))
                effects.append(Emit("task.overran", {"task_id": task_id.hex()}))
            elif job.state is JobState.QUEUED:
                self._move(job, JobState.FAILED, now + REMEMBER_MS)
                self._count("queued_expired")
                effects += self._reject(job.requester, task_id, job.attempt,
                                        RejectReason.COMPUTE_FAILED,
                                        "the deadline passed while queued")
            else:
                del self.jobs[task_id]
        for key in [k for k, until in self.seen.items() if now >= until]:
            del self.seen[key]
        return effects + self._start_queued()
