"""The learner's side of the rollout market: beacon each job, select a worker, judge its group.

Contract
--------
* ``IssueJobs(count, version)`` issues jobs in the job book (protocol/rl/jobs.py) and publishes
  a signed ``RolloutBeacon`` for each on ``RL_BEACON_TOPIC``: model, policy version, prompt
  seed, G, sampling and the time left for the job.
* Bids (``RolloutBid``: a market ``BidBody`` signed by its bidder, who must be the sender) are
  collected until ``1 + spare_bids`` are in or ``bid_window_ms`` passes; a worker the book has
  excluded (caught cheating in this run) is not heard. The market's ``Selector`` (score or
  LinUCB, with the ledger's reputation) picks one; it gets a signed ``RolloutAssign`` with a
  deadline of ``assign_base_ms + assign_slack x`` its estimated latency, within the job's time,
  and the other bidders a ``RolloutCancel`` releasing the slots their bids hold.
  With no bid the job is beaconed again (up to ``max_rounds``) until the book times it out.
* A ``RolloutResult`` must be signed and sent by the worker it names (else ``Penalize``); the
  book judges it: ``GroupAccepted`` hands an accepted group to the learner, every attestation
  the book yields is returned as the market's ``Attest`` (the driver maps it with
  ``protocol.market.attestations.ledger_attestation``), the selector is rewarded 1 for an
  accepted group and 0 for a caught one, and every reissued job is beaconed again at once.
* A ``RolloutReject`` from the worker running the job reissues it; ``Tick`` closes bid windows
  and lets the book time out jobs past their deadline (the learner never waits past one).
* ``Convict(job_id, reason)``: a check the learner ran on an accepted group failed (its
  log-probabilities disagree with the recomputation under the job's version): the worker is
  attested, excluded and the job's prompts reissued, as on a failed validation.
* ``PublishVersion(v)``: the learner now trains ``v``; jobs still bidding for a version beyond
  the staleness bound are withdrawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from crypto.keys import Identity
from protocol.codec import MAX_FRAME_BYTES, Message
from protocol.envelopes import Unopened, open_authored, seal
from protocol.machine import Effect, Emit, OnMessage, Publish, Received, Send, Tick, on_received
from protocol.market.messages import MAX_TASK_MS, BidBody
from protocol.market.selection import Candidate, Selector, assignment_ms
from protocol.rl.events import Convict, GroupAccepted, IssueJobs, PublishVersion
from protocol.rl.jobs import ACCEPTED, INVALID, STALE, JobBook, Verdict
from protocol.rl.messages import (
    MAX_ATTEMPT,
    RL_ASSIGN_DOMAIN,
    RL_BEACON_DOMAIN,
    RL_BEACON_TOPIC,
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
    RolloutResult,
    RolloutResultBody,
)
from protocol.rl.staleness import accepts


@dataclass(frozen=True, slots=True)
class AuctionSettings:
    bid_window_ms: int = 1_000
    #: close a window early once this many bids beyond the first are in
    spare_bids: int = 2
    max_rounds: int = 8
    max_price: float = 1e6
    assign_base_ms: int = 5_000
    assign_slack: float = 3.0
    max_bids_per_job: int = 64
    max_frame: int = MAX_FRAME_BYTES


@dataclass(slots=True)
class BidWindow:
    """One job's open bid window: its round, when it closes, the bids in."""

    job: RolloutJob
    round: int
    closes_at_ms: int
    bids: dict[str, BidBody] = field(default_factory=dict)


class RolloutAuction:
    def __init__(self, identity: Identity, book: JobBook, selector: Selector,
                 reputation: Callable[[str], float] = lambda peer: 0.5,
                 settings: AuctionSettings | None = None) -> None:
        self.identity = identity
        self.peer = identity.peer_id
        self.book = book
        self.selector = selector
        self.reputation = reputation
        self.settings = settings if settings is not None else AuctionSettings()
        self.bidding: dict[bytes, BidWindow] = {}
        self.next_attempt = 0
        self.counters: dict[str, int] = {}
        self._on_message: dict[type[Message], OnMessage] = {
            RolloutBid: self._on_bid, RolloutResult: self._on_result,
            RolloutReject: self._on_reject}

    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, Received):
            return on_received(self._on_message, event, now)
        if isinstance(event, IssueJobs):
            out: list[Effect] = []
            for _ in range(event.count):
                out += self._beacon(self.book.new_job(now, version=event.version), 0, now)
            return out
        if isinstance(event, PublishVersion):
            return self._publish(event.version)
        if isinstance(event, Convict):
            return self._convict(event, now)
        if isinstance(event, Tick):
            return self._on_tick(now)
        return []

    def next_deadline(self) -> int | None:
        times = [b.closes_at_ms for b in self.bidding.values()]
        book = self.book.next_deadline()
        if book is not None:
            times.append(book)
        return min(times, default=None)

    # ------------------------------------------------------------ beacons and bids
    def _time_left(self, job: RolloutJob, now: int) -> int:
        record = self.book.jobs.get(job.job_id)
        if record is None:
            return 0
        return record.issued_at_ms + self.book.config.job_ms - now

    def _beacon(self, job: RolloutJob, round_: int, now: int) -> list[Effect]:
        left = self._time_left(job, now)
        s = self.settings
        if left <= s.bid_window_ms or round_ >= s.max_rounds:
            return []  # the book times it out and reissues it
        self.bidding[job.job_id] = BidWindow(job, round_, now + s.bid_window_ms)
        body = RolloutBeaconBody(job=job, round=round_, max_price=s.max_price,
                                 bid_window_ms=s.bid_window_ms,
                                 deadline_ms=min(left, MAX_TASK_MS))
        self._count("beacons")
        return [Publish(RL_BEACON_TOPIC,
                        RolloutBeacon(envelope=seal(self.identity, RL_BEACON_DOMAIN, body)))]

    def _on_bid(self, peer: str, msg: RolloutBid, now: int) -> list[Effect]:
        try:
            body = open_authored(msg.envelope, RL_BID_DOMAIN, BidBody, self.settings.max_frame,
                                 sender=peer, author=lambda b: b.bidder)
        except Unopened as refused:
            return refused.refusal(peer, "bid", self.counters)
        open_job = self.bidding.get(body.task_id)
        if (open_job is None or body.round != open_job.round or now >= open_job.closes_at_ms
                or peer in open_job.bids):
            self._count("bid_late")
            return []
        if not self.book.eligible(peer) or body.model != open_job.job.model:
            self._count("bid_ignored")
            return []
        if len(open_job.bids) >= self.settings.max_bids_per_job:
            return []
        open_job.bids[peer] = body
        if len(open_job.bids) >= 1 + self.settings.spare_bids:
            return self._close(open_job, now)
        return []

    def _close(self, open_job: BidWindow, now: int) -> list[Effect]:
        job = open_job.job
        del self.bidding[job.job_id]
        left = self._time_left(job, now)
        candidates = [
            Candidate(peer=p, match_score=b.match_score, reputation=self.reputation(p),
                      price=b.price, max_price=self.settings.max_price,
                      est_latency_ms=b.est_latency_ms, deadline_ms=max(0, left), load=b.load,
                      free_slots=b.free_slots)
            for p, b in sorted(open_job.bids.items()) if self.book.eligible(p)]
        picked = self.selector.select(job.job_id, candidates, 1)
        if not picked:
            self._count("no_bids")
            return self._beacon(job, open_job.round + 1, now)
        worker = picked[0].peer
        s = self.settings
        due = assignment_ms(s.assign_base_ms, s.assign_slack, picked[0].est_latency_ms, left)
        if due < 1:
            return []
        attempt = self.next_attempt
        self.next_attempt = (self.next_attempt + 1) % (MAX_ATTEMPT + 1)
        self.book.assign(job.job_id, worker, now, due)
        body = RolloutAssignBody(job=job, worker=worker, attempt=attempt,
                                 round=open_job.round, deadline_ms=due)
        self._count("assigned")
        release: list[Effect] = [Send(p, RolloutCancel(job_id=job.job_id, attempt=-1))
                                 for p in sorted(open_job.bids) if p != worker]
        return [*release,
                Send(worker, RolloutAssign(envelope=seal(self.identity, RL_ASSIGN_DOMAIN, body))),
                Emit("rl.assigned", {"job_id": job.job_id.hex(), "worker": worker,
                                     "version": job.policy_version, "due_ms": due})]

    # ------------------------------------------------------------ results
    def _on_result(self, peer: str, msg: RolloutResult, now: int) -> list[Effect]:
        try:
            body = open_authored(msg.envelope, RL_RESULT_DOMAIN, RolloutResultBody,
                                 self.settings.max_frame, sender=peer, author=lambda b: b.worker)
        except Unopened as refused:
            return refused.refusal(peer, "result", self.counters)
        verdict = self.book.receive(body, peer, now)
        self._count(f"result.{verdict.outcome}")
        effects: list[Effect] = [Emit(f"rl.{verdict.outcome}", {
            "job_id": body.job_id.hex(), "worker": peer, "version": body.policy_version,
            "training": self.book.version, "reason": verdict.reason})]
        if verdict.outcome == ACCEPTED:
            self.selector.observe(body.job_id, peer, 1.0)
            effects.append(GroupAccepted(body))
        elif verdict.outcome == INVALID:
            self.selector.observe(body.job_id, peer, 0.0)
        elif verdict.outcome != STALE and verdict.outcome != "excluded":
            return effects  # unknown: a late result of a job already ended; nothing to do
        return effects + self._after(verdict, now)

    def _after(self, verdict: Verdict, now: int) -> list[Effect]:
        """The attestation, the cancels of the worker's other jobs and the reissued jobs'
        beacons of a verdict."""
        out: list[Effect] = [verdict.attest] if verdict.attest is not None else []
        out += [Send(verdict.worker, RolloutCancel(job_id=j, attempt=-1))
                for j in verdict.cancelled]
        for job in verdict.reissued:
            out += self._beacon(job, 0, now)
        return out

    def _convict(self, event: Convict, now: int) -> list[Effect]:
        verdict = self.book.convict(event.job_id, event.reason, now)
        if verdict is None:
            return []
        self.selector.observe(event.job_id, verdict.worker, 0.0)
        return [Emit("rl.convicted", {"job_id": event.job_id.hex(), "worker": verdict.worker,
                                      "reason": event.reason}), *self._after(verdict, now)]

    def _on_reject(self, peer: str, msg: RolloutReject, now: int) -> list[Effect]:
        verdict = self.book.refused(msg.job_id, peer, now)
        if verdict is None:
            return []
        self._count(f"refused.{msg.reason.value}")
        return [Emit("rl.refused", {"job_id": msg.job_id.hex(), "worker": peer,
                                    "why": msg.reason.value}), *self._after(verdict, now)]

    # ------------------------------------------------------------ time
    def _publish(self, version: int) -> list[Effect]:
        self.book.publish(version)
        for job_id, open_job in list(self.bidding.items()):
            if not accepts(open_job.job.policy_version, version, self.book.config.max_staleness):
                del self.bidding[job_id]
                self.book.cancel(job_id)
                self._count("withdrawn_stale")
        return [Emit("rl.version", {"version": version})]

    def _on_tick(self, now: int) -> list[Effect]:
        out: list[Effect] = []
        for open_job in [b for b in self.bidding.values() if now >= b.closes_at_ms]:
            out += self._close(open_job, now)
        for verdict in self.book.expire(now):
            self.bidding.pop(verdict.job_id, None)
            self._count(f"expired.{verdict.outcome}")
            out += self._after(verdict, now)
        return out
