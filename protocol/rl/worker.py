"""The rollout worker's side of the market: bid on rollout beacons, run the jobs assigned.

Contract
--------
* A ``RolloutBeacon`` (gossip) is opened and must be signed by the job's learner (else the
  forwarder is penalized). The worker bids (a signed ``RolloutBid``) only when it serves the
  job's model, holds the job's policy version now (``versions()``), has a free slot and can
  finish before the job's deadline at its measured speed; it then holds a slot for the job for
  ``hold_ms``. One bid per job and round.
* A ``RolloutAssign`` must be signed and sent by the job's learner and name this worker; the
  worker refuses it with a ``RolloutReject`` when it never bid (``NOT_BID``), its reservation
  lapsed (``EXPIRED``), or it no longer holds the job's version (``OTHER_VERSION``, e.g. the
  adapter was evicted since the bid). Otherwise the job joins the worker's queue: it starts
  (``StartRollout``) once fewer than ``parallel`` jobs run, in the order assigned, and its
  deadline (``deadline_ms`` of the assignment) counts from then, not from the assignment: a
  job that waited behind another is not cut short by the other's run. A queued job waits at
  most as long as the running jobs' deadlines, so the queue holds no job forever.
* ``learners``: the learners whose signed beacons for this worker's model it has seen (the
  last :data:`MAX_LEARNERS`). The first beacon of a learner returns ``LearnerSeen``: a
  worker that was given no learner takes relayed adapters only from these
  (node/rl/dissemination.py), not from any publisher of its model's artifact.
* ``RolloutDone`` (the driver's finished generation) becomes a signed ``RolloutResult`` for the
  learner, its ``worker`` and ``attempt`` set here; ``RolloutFailed`` becomes a ``RolloutReject``
  (``COMPUTE_FAILED``). A job still running at its deadline is cancelled (``CancelRollout``)
  and its slot freed: the learner has reissued it by then. A ``RolloutCancel`` from the job's
  learner releases the slot of a losing bid (attempt -1), takes a queued attempt out of the
  queue, or stops the running attempt.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

from crypto.keys import Identity
from protocol.codec import MAX_FRAME_BYTES, Message
from protocol.envelopes import PENALTY_FORGED, Unopened, open_authored, open_envelope, seal
from protocol.errors import InvalidMessage
from protocol.machine import Effect, Emit, OnMessage, Penalize, Received, Send, Tick, on_received
from protocol.market.messages import HASH_LEN, BidBody
from protocol.rl.events import CancelRollout, LearnerSeen, RolloutDone, RolloutFailed, StartRollout
from protocol.rl.messages import (
    RL_ASSIGN_DOMAIN,
    RL_BEACON_DOMAIN,
    RL_BID_DOMAIN,
    RL_RESULT_DOMAIN,
    RolloutAssign,
    RolloutAssignBody,
    RolloutBeacon,
    RolloutBeaconBody,
    RolloutBid,
    RolloutCancel,
    RolloutJob,
    RolloutReject,
    RolloutRejectReason,
    RolloutResult,
)

#: how long a worker remembers a job it bid on or ran, after it ended
REMEMBER_MS = 10 * 60 * 1000
#: learners a worker remembers having seen beacons from
MAX_LEARNERS = 64


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    model: str
    model_hash: bytes = b""
    #: jobs held at once (reserved by a bid, queued or running)
    slots: int = 1
    #: jobs generated at once (0 = ``slots``); the other assigned jobs wait in the queue
    parallel: int = 0
    #: measured generation speed, for the latency in bids
    tokens_per_s: float = 30.0
    price_per_1k: float = 0.0
    #: how long a bid holds a slot
    hold_ms: int = 10_000
    max_frame: int = MAX_FRAME_BYTES

    def __post_init__(self) -> None:
        if self.slots < 1 or self.tokens_per_s <= 0 or self.hold_ms < 1 or self.parallel < 0:
            raise ValueError("slots, tokens_per_s and hold_ms must be positive, parallel not "
                             "negative")
        if len(self.model_hash) > HASH_LEN:
            raise ValueError(f"model_hash is longer than {HASH_LEN} bytes")


class Slot(enum.Enum):
    RESERVED = "reserved"
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"


@dataclass(slots=True)
class WorkerJob:
    job: RolloutJob
    state: Slot
    #: reservation expiry, result deadline, or forget-at once ENDED (unused while QUEUED)
    until_ms: int
    round: int
    attempt: int = -1
    #: the assignment's time for the job, counted from when it leaves the queue
    deadline_ms: int = 0


class RolloutWorkerMachine:
    def __init__(self, identity: Identity, config: WorkerConfig,
                 versions: Callable[[], Collection[int]]) -> None:
        self.identity = identity
        self.peer = identity.peer_id
        self.config = config
        self.versions = versions
        self.jobs: dict[bytes, WorkerJob] = {}
        #: assigned jobs waiting to start, in the order assigned (ended ones are skipped)
        self.queue: list[bytes] = []
        self.counters: dict[str, int] = {}
        #: learners whose beacons for this model were seen, oldest first
        self.learners: dict[str, None] = {}
        self._on_message: dict[type[Message], OnMessage] = {
            RolloutBeacon: self._on_beacon, RolloutAssign: self._on_assign,
            RolloutCancel: self._on_cancel}

    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    def busy(self) -> int:
        return sum(j.state is not Slot.ENDED for j in self.jobs.values())

    def handle(self, event: object, now: int) -> list[Effect]:
        effects = self._dispatch(event, now)
        return effects + self._start_queued(now) if self.queue else effects

    def _dispatch(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received):
            return on_received(self._on_message, event, now)
        if isinstance(event, RolloutDone):
            return self._on_done(event, now)
        if isinstance(event, RolloutFailed):
            return self._on_failed(event, now)
        if isinstance(event, Tick):
            return self._on_tick(now)
        return []

    def next_deadline(self) -> int | None:
        return min((j.until_ms for j in self.jobs.values() if j.state is not Slot.QUEUED),
                   default=None)

    def _start_queued(self, now: int) -> list[Effect]:
        """Start queued jobs, oldest first, while fewer than ``parallel`` run."""
        effects: list[Effect] = []
        parallel = self.config.parallel or self.config.slots
        running = sum(j.state is Slot.RUNNING for j in self.jobs.values())
        while self.queue and running < parallel:
            mine = self.jobs.get(self.queue.pop(0))
            if mine is None or mine.state is not Slot.QUEUED:
                continue  # cancelled while it waited
            mine.state, mine.until_ms = Slot.RUNNING, now + mine.deadline_ms
            running += 1
            self._count("jobs_started")
            effects += [StartRollout(mine.job, mine.attempt, mine.until_ms),
                        Emit("rl.job_started", {"job_id": mine.job.job_id.hex(),
                                                "version": mine.job.policy_version})]
        return effects

    # ------------------------------------------------------------ beacons -> bids
    def _on_beacon(self, origin: str, msg: RolloutBeacon, now: int) -> list[Effect]:
        try:
            body = open_envelope(msg.envelope, RL_BEACON_DOMAIN, RolloutBeaconBody,
                                 self.config.max_frame)
        except InvalidMessage as exc:
            return [Penalize(origin, f"invalid rollout beacon: {exc}", PENALTY_FORGED)]
        job = body.job
        if msg.envelope.signer != job.learner:
            return [Penalize(origin, "rollout beacon not signed by its learner",
                             PENALTY_FORGED)]
        seen = self._seen(job)
        why = self._skip_reason(body, now)
        if why is not None:
            self._count(f"beacon_skipped.{why}")
            return [*seen, Emit("rl.beacon_skipped", {"job_id": job.job_id.hex(), "why": why})]
        hold = min(self.config.hold_ms, body.deadline_ms)
        self.jobs[job.job_id] = WorkerJob(job, Slot.RESERVED, now + hold, body.round)
        c = self.config
        bid = BidBody(task_id=job.job_id, round=body.round, bidder=self.peer, model=c.model,
                      model_hash=c.model_hash, match_score=1.0,
                      price=min(body.max_price, self._price(job)),
                      est_latency_ms=self._latency_ms(job),
                      load=min(1.0, self.busy() / c.slots), free_slots=c.slots - self.busy(),
                      hold_ms=hold)
        self._count("bids_sent")
        return [*seen,
                Send(job.learner, RolloutBid(envelope=seal(self.identity, RL_BID_DOMAIN, bid))),
                Emit("rl.bid_sent", {"job_id": job.job_id.hex(), "version": job.policy_version})]

    def _seen(self, job: RolloutJob) -> list[Effect]:
        """Remember the learner of a genuine beacon for this worker's model."""
        if job.model != self.config.model or not self.config.model or job.learner == self.peer:
            return []
        new = job.learner not in self.learners
        self.learners.pop(job.learner, None)
        self.learners[job.learner] = None
        while len(self.learners) > MAX_LEARNERS:
            del self.learners[next(iter(self.learners))]
        return [LearnerSeen(job.learner), Emit("rl.learner_seen", {"learner": job.learner})
                ] if new else []

    def _skip_reason(self, body: RolloutBeaconBody, now: int) -> str | None:
        job = body.job
        known = self.jobs.get(job.job_id)
        if known is not None and (known.state is not Slot.ENDED or known.round >= body.round):
            return "already_bid"
        if job.learner == self.peer:
            return "own_job"
        if job.model != self.config.model:
            return "other_model"
        if job.policy_version not in self.versions():
            return "other_version"
        if self.busy() >= self.config.slots:
            return "no_slot"
        if self._latency_ms(job) > body.deadline_ms:
            return "too_slow"
        if self._price(job) > body.max_price:
            return "too_cheap"
        return None

    def _latency_ms(self, job: RolloutJob) -> int:
        tokens = job.prompts * job.group_size * job.sampling.max_tokens
        return int(tokens / self.config.tokens_per_s * 1000)

    def _price(self, job: RolloutJob) -> float:
        tokens = job.prompts * job.group_size * job.sampling.max_tokens
        return self.config.price_per_1k * tokens / 1000

    # ------------------------------------------------------------ assignments
    def _reject(self, learner: str, job_id: bytes, attempt: int, reason: RolloutRejectReason,
                detail: str) -> list[Effect]:
        self._count(f"assign_refused.{reason.value}")
        return [Send(learner, RolloutReject(job_id=job_id, attempt=attempt, reason=reason,
                                            detail=detail[:128])),
                Emit("rl.assign_refused", {"job_id": job_id.hex(), "why": reason.value})]

    def _on_assign(self, peer: str, msg: RolloutAssign, now: int) -> list[Effect]:
        try:
            body = open_authored(msg.envelope, RL_ASSIGN_DOMAIN, RolloutAssignBody,
                                 self.config.max_frame, sender=peer, author=lambda b: b.job.learner)
        except Unopened as refused:
            return [Penalize(peer, f"rollout assignment refused: {refused}", PENALTY_FORGED)]
        job = body.job
        if body.worker != self.peer:
            return self._reject(peer, job.job_id, body.attempt, RolloutRejectReason.BAD_ASSIGN,
                                "addressed to another worker")
        mine = self.jobs.get(job.job_id)
        if mine is None or mine.state is Slot.ENDED or mine.job.learner != job.learner:
            return self._reject(peer, job.job_id, body.attempt, RolloutRejectReason.NOT_BID,
                                "no bid for this job")
        if mine.state in (Slot.RUNNING, Slot.QUEUED):
            return []  # a retransmission of what we already run or queued
        if now >= mine.until_ms:
            self._end(mine, now)
            return self._reject(peer, job.job_id, body.attempt, RolloutRejectReason.EXPIRED,
                                "reservation expired")
        if job != mine.job:
            self._end(mine, now)
            return self._reject(peer, job.job_id, body.attempt, RolloutRejectReason.BAD_ASSIGN,
                                "the job differs from the one bid on")
        if job.policy_version not in self.versions():
            self._end(mine, now)
            return self._reject(peer, job.job_id, body.attempt,
                                RolloutRejectReason.OTHER_VERSION,
                                f"version {job.policy_version} is not held here")
        mine.state, mine.attempt, mine.deadline_ms = Slot.QUEUED, body.attempt, body.deadline_ms
        self.queue.append(job.job_id)
        return []  # handle() starts it once a runner is free

    def _on_cancel(self, peer: str, msg: RolloutCancel, now: int) -> list[Effect]:
        mine = self.jobs.get(msg.job_id)
        if mine is None or mine.job.learner != peer or mine.state is Slot.ENDED:
            return []
        if mine.state is Slot.RESERVED and msg.attempt == -1:
            self._end(mine, now)
            self._count("released")
            return []
        if mine.state is Slot.QUEUED and msg.attempt in (-1, mine.attempt):
            self._end(mine, now)  # never started: nothing to stop
            self._count("cancelled")
            return []
        if mine.state is Slot.RUNNING and msg.attempt in (-1, mine.attempt):
            self._end(mine, now)
            self._count("cancelled")
            return [CancelRollout(msg.job_id, mine.attempt)]
        return []

    def _end(self, mine: WorkerJob, now: int) -> None:
        mine.state = Slot.ENDED
        mine.until_ms = now + REMEMBER_MS

    # ------------------------------------------------------------ results
    def _running(self, job_id: bytes, attempt: int) -> WorkerJob | None:
        mine = self.jobs.get(job_id)
        if mine is None or mine.state is not Slot.RUNNING or mine.attempt != attempt:
            return None
        return mine

    def _on_done(self, event: RolloutDone, now: int) -> list[Effect]:
        mine = self._running(event.job_id, event.attempt)
        if mine is None:
            self._count("result_dropped")
            return []  # cancelled or timed out meanwhile
        self._end(mine, now)
        body = replace(event.result, job_id=mine.job.job_id, attempt=mine.attempt,
                       worker=self.peer)
        self._count("results_sent")
        return [Send(mine.job.learner,
                     RolloutResult(envelope=seal(self.identity, RL_RESULT_DOMAIN, body))),
                Emit("rl.result_sent", {"job_id": mine.job.job_id.hex(),
                                        "completions": len(body.completions)})]

    def _on_failed(self, event: RolloutFailed, now: int) -> list[Effect]:
        mine = self._running(event.job_id, event.attempt)
        if mine is None:
            return []
        self._end(mine, now)
        return self._reject(mine.job.learner, mine.job.job_id, mine.attempt,
                            RolloutRejectReason.COMPUTE_FAILED, event.reason)

    def _on_tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for job_id, mine in list(self.jobs.items()):
            if now < mine.until_ms or mine.state is Slot.QUEUED:
                continue
            if mine.state is Slot.ENDED:
                del self.jobs[job_id]
            elif mine.state is Slot.RUNNING:
                self._count("jobs_overrun")
                effects.append(CancelRollout(job_id, mine.attempt))
                self._end(mine, now)
            else:
                self._end(mine, now)
        return effects
