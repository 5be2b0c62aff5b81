"""The rollout job kind in the market: learner's auction and workers, driven in process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from random import Random

from crypto.keys import Identity
from protocol.codec import Message, decode, encode
from protocol.ledger.records import AttestationKind
from protocol.machine import Publish, Received, Send, Tick
from protocol.market.attestations import ledger_attestation
from protocol.market.events import Attest
from protocol.market.selection import ExploringSelector, ScoreSelector
from protocol.rl.auction import RolloutAuction
from protocol.rl.events import (
    GroupAccepted,
    IssueJobs,
    LearnerSeen,
    PublishVersion,
    RolloutDone,
    StartRollout,
)
from protocol.rl.jobs import BookConfig, JobBook
from protocol.rl.messages import (
    RolloutAssign,
    RolloutReject,
    RolloutRejectReason,
    RolloutResultBody,
    RolloutSampling,
)
from protocol.rl.worker import RolloutWorkerMachine, WorkerConfig
from tests.protocol.rl_fixtures import VOCAB, honest_result

MODEL = "smollm2-135m"
Generate = Callable[[StartRollout], RolloutResultBody | None]


def honest(start: StartRollout) -> RolloutResultBody:
    return honest_result(start.job)


def easy_prompts(start: StartRollout) -> RolloutResultBody:
    return replace(honest_result(start.job), prompt_indices=(0, 1))


class Net:
    """Delivers Send / Publish between the machines (through the codec) and runs the
    workers' computations with ``generate`` (None: the worker never answers)."""

    def __init__(self, staleness: int = 1, **workers: tuple[float, set[int], Generate]) -> None:
        self.learner_id = Identity.generate()
        config = BookConfig(learner=self.learner_id.peer_id, model=MODEL, dataset_size=100,
                            vocab_size=VOCAB, prompts_per_job=2, group_size=4,
                            max_staleness=staleness, job_ms=60_000,
                            sampling=RolloutSampling(temperature=1.0, top_p=1.0, max_tokens=8))
        self.auction = RolloutAuction(self.learner_id, JobBook(config, Random(1)),
                                      ScoreSelector())
        self.workers: dict[str, tuple[RolloutWorkerMachine, Generate]] = {}
        self.names: dict[str, str] = {}
        for name, (speed, versions, generate) in workers.items():
            ident = Identity.generate()
            machine = RolloutWorkerMachine(ident, WorkerConfig(model=MODEL, tokens_per_s=speed),
                                           lambda v=versions: v)  # type: ignore[misc]
            self.workers[ident.peer_id] = (machine, generate)
            self.names[ident.peer_id] = name
        self.now = 0
        self.out: list[object] = []  # the learner's own effects: accepted groups, attests
        self.wire: list[tuple[str, str, Message]] = []

    def peer(self, name: str) -> str:
        return next(p for p, n in self.names.items() if n == name)

    def learner(self, event: object) -> None:
        self._route(self.learner_id.peer_id, self.auction.handle(event, self.now))

    def _route(self, sender: str, effects: list[object]) -> None:
        for effect in effects:
            if isinstance(effect, Publish):
                msg = decode(encode(effect.message), type(effect.message))
                for peer in list(self.workers):
                    self._to_worker(peer, Received(sender, msg))
            elif isinstance(effect, Send):
                msg = decode(encode(effect.message), type(effect.message))
                self.wire.append((sender, effect.peer, msg))
                if effect.peer == self.learner_id.peer_id:
                    self.learner(Received(sender, msg))
                else:
                    self._to_worker(effect.peer, Received(sender, msg))
            elif isinstance(effect, StartRollout):
                machine, generate = self.workers[sender]
                body = generate(effect)
                if body is not None:
                    self._to_worker(sender, RolloutDone(effect.job.job_id, effect.attempt, body))
            elif sender == self.learner_id.peer_id:
                self.out.append(effect)

    def _to_worker(self, peer: str, event: object) -> None:
        machine, _ = self.workers[peer]
        self._route(peer, machine.handle(event, self.now))

    def tick(self, now: int) -> None:
        self.now = now
        self.learner(Tick())
        for peer in list(self.workers):
            self._to_worker(peer, Tick())

    def accepted(self) -> list[RolloutResultBody]:
        return [e.result for e in self.out if isinstance(e, GroupAccepted)]

    def attests(self) -> list[tuple[str, AttestationKind]]:
        return [(self.names[e.subject], ledger_attestation(e).kind)
                for e in self.out if isinstance(e, Attest)]


def test_a_job_goes_to_the_best_bidder_and_its_group_is_accepted() -> None:
    net = Net(fast=(200.0, {0}, honest), slow=(20.0, {0}, honest))
    net.learner(IssueJobs(1))  # both bid; 2 bids < 1 + 2 spares, so the window stays open
    net.tick(1_000)  # the window closes; the faster bidder wins on latency
    [group] = net.accepted()
    assert group.worker == net.peer("fast") and group.policy_version == 0
    assert net.attests() == [("fast", AttestationKind.TASK_COMPLETED)]
    assert net.auction.book.in_flight() == 0
    slow, _ = net.workers[net.peer("slow")]
    assert slow.counters["released"] == 1 and slow.busy() == 0  # the losing bid's slot


def test_a_worker_serving_another_version_does_not_bid_and_refuses() -> None:
    net = Net(old=(200.0, {0}, honest), new=(50.0, {0, 1}, honest))
    net.learner(PublishVersion(1))
    net.learner(IssueJobs(1))
    assert net.workers[net.peer("old")][0].counters == {"beacon_skipped.other_version": 1}
    net.tick(1_000)
    assert [g.worker for g in net.accepted()] == [net.peer("new")]
    # it bid while it held version 1, then evicted it before the assignment came: it refuses
    worker, _ = net.workers[net.peer("new")]
    net.learner(IssueJobs(1, version=1))
    assert net.auction.bidding  # the bid is in, the window still open
    worker.versions = lambda: {0}
    net.tick(2_000)
    rejects = [m for _, _, m in net.wire if isinstance(m, RolloutReject)]
    assert [r.reason for r in rejects] == [RolloutRejectReason.OTHER_VERSION]
    assert net.auction.counters["refused.other_version"] == 1


def test_a_worker_not_assigned_refuses_the_assignment() -> None:
    net = Net(w=(100.0, {0}, honest))
    peer = net.peer("w")
    job = net.auction.book.new_job(0)
    from protocol.envelopes import seal
    from protocol.rl.messages import RL_ASSIGN_DOMAIN, RolloutAssignBody

    body = RolloutAssignBody(job=job, worker=peer, attempt=0, round=0, deadline_ms=5_000)
    net._route(net.learner_id.peer_id, [Send(peer, RolloutAssign(
        envelope=seal(net.learner_id, RL_ASSIGN_DOMAIN, body)))])
    [(_, _, reject)] = [w for w in net.wire if isinstance(w[2], RolloutReject)]
    assert reject.reason is RolloutRejectReason.NOT_BID  # type: ignore[attr-defined]


def test_a_cheater_is_caught_attested_excluded_and_the_job_reissued() -> None:
    net = Net(cheat=(500.0, {0}, easy_prompts), honest=(100.0, {0}, honest))
    net.learner(IssueJobs(1))
    net.tick(1_000)  # the fast cheater wins the first job ...
    assert net.attests() == [("cheat", AttestationKind.TASK_FAILED)]
    assert not net.auction.book.eligible(net.peer("cheat"))
    net.tick(2_000)  # ... the reissued job (same prompts) goes to the honest worker
    [group] = net.accepted()
    assert group.worker == net.peer("honest")
    net.learner(IssueJobs(2))
    net.tick(3_000)
    assert {g.worker for g in net.accepted()} == {net.peer("honest")}
    assert net.attests().count(("cheat", AttestationKind.TASK_FAILED)) == 1


def test_a_silent_worker_times_out_and_the_job_is_reissued() -> None:
    net = Net(silent=(500.0, {0}, lambda s: None))
    net.learner(IssueJobs(1))
    net.tick(1_000)
    assert net.auction.book.in_flight() == 1
    due = net.auction.book.next_deadline()
    assert due is not None and due < 60_000
    net.tick(due)
    assert net.attests() == [("silent", AttestationKind.TASK_TIMED_OUT)]
    assert net.auction.book.counters["reissued"] == 1 and net.auction.bidding


def test_a_group_beyond_the_staleness_bound_is_dropped_without_attestation() -> None:
    held: list[StartRollout] = []
    net = Net(staleness=1, w=(100.0, {0, 1, 2}, lambda s: held.append(s) or None))
    net.learner(IssueJobs(1))
    net.tick(1_000)
    net.learner(PublishVersion(2))
    start = held[0]
    net._to_worker(net.peer("w"), RolloutDone(start.job.job_id, start.attempt,
                                              honest_result(start.job)))
    assert net.accepted() == [] and net.attests() == []
    assert net.auction.counters["result.stale"] == 1


def test_forged_results_and_bids_are_penalized() -> None:
    from protocol.envelopes import seal
    from protocol.machine import Penalize
    from protocol.rl.messages import RL_RESULT_DOMAIN, RolloutResult

    net = Net(w=(100.0, {0}, honest))
    other = Identity.generate()
    job = net.auction.book.new_job(0)
    body = replace(honest_result(job), worker=net.peer("w"))
    forged = RolloutResult(envelope=seal(other, RL_RESULT_DOMAIN, body))
    effects = net.auction.handle(Received(net.peer("w"), forged), 0)
    assert any(isinstance(e, Penalize) for e in effects)


def test_a_convicted_group_excludes_its_worker_from_the_next_auctions() -> None:
    from protocol.rl.events import Convict

    net = Net(a=(500.0, {0}, honest), b=(100.0, {0}, honest))
    net.learner(IssueJobs(1))
    net.tick(1_000)
    [group] = net.accepted()
    assert group.worker == net.peer("a")
    net.learner(Convict(group.job_id, "mismatch KL 0.9 above the threshold"))
    assert ("a", AttestationKind.TASK_FAILED) in net.attests()
    net.tick(2_000)  # the reissued job goes to b
    assert [g.worker for g in net.accepted()] == [net.peer("a"), net.peer("b")]


def test_workers_remember_learners_whose_beacons_they_saw_and_say_so_once() -> None:
    net = Net(holder=(200.0, {0}, honest), behind=(50.0, {7}, honest))
    beacons = [e.message for e in net.auction.handle(IssueJobs(2), 0) if isinstance(e, Publish)]
    assert len(beacons) == 2
    for machine, _ in net.workers.values():
        seen = [machine.handle(Received("relay", b), 0) for b in beacons]
        firsts = [e for effects in seen for e in effects if isinstance(e, LearnerSeen)]
        # a worker that cannot bid (it lacks the version) still learns who the learner is
        assert firsts == [LearnerSeen(net.learner_id.peer_id)]
        assert list(machine.learners) == [net.learner_id.peer_id]
    other = Net(stranger=(200.0, {0}, honest))
    other_model = RolloutWorkerMachine(Identity.generate(), WorkerConfig(model="another"),
                                       lambda: {0})
    beacon = next(e.message for e in other.auction.handle(IssueJobs(1), 0)
                  if isinstance(e, Publish))
    assert not [e for e in other_model.handle(Received("relay", beacon), 0)
                if isinstance(e, LearnerSeen)]
    assert not other_model.learners


def test_an_exploring_selector_lets_a_newcomer_win_a_bounded_share_of_jobs() -> None:
    """The fast worker wins every job on latency; with the daemon's exploring selector the
    slower newcomer gets its first job once the share allows it (then its record decides)."""
    for share, newcomer_jobs in ((0.0, 0), (0.25, 1)):
        net = Net(fast=(200.0, {0}, honest), slow=(20.0, {0}, honest))
        net.auction.selector = ExploringSelector(ScoreSelector(), share=share)
        for i in range(8):
            net.learner(IssueJobs(1))
            net.tick(1_000 * (i + 1))
        workers = [net.names[g.worker] for g in net.accepted()]
        assert len(workers) == 8 and workers.count("slow") == newcomer_jobs


def test_a_queued_jobs_deadline_starts_when_it_reaches_the_head_of_the_queue() -> None:
    """Two jobs assigned at once to a worker that generates one at a time: the second waits,
    and its time counts from its start, so the first's run does not use it up."""
    from protocol.envelopes import seal
    from protocol.rl.events import CancelRollout
    from protocol.rl.messages import (
        RL_ASSIGN_DOMAIN,
        RL_BEACON_DOMAIN,
        RolloutAssignBody,
        RolloutBeacon,
        RolloutBeaconBody,
        RolloutCancel,
    )
    from tests.protocol.rl_fixtures import make_job

    learner = Identity.generate()
    worker = RolloutWorkerMachine(Identity.generate(), WorkerConfig(
        model=MODEL, slots=3, parallel=1, tokens_per_s=1000.0), lambda: {3})
    jobs = [make_job(job_id=bytes([i]) * 32, learner=learner.peer_id) for i in range(3)]

    def starts(effects: list[object]) -> list[tuple[bytes, int]]:
        return [(e.job.job_id, e.deadline_at_ms) for e in effects if isinstance(e, StartRollout)]

    assigned = []
    for job in jobs:
        beacon = RolloutBeaconBody(job=job, round=0, max_price=1.0, bid_window_ms=500,
                                   deadline_ms=60_000)
        worker.handle(Received(learner.peer_id, RolloutBeacon(
            envelope=seal(learner, RL_BEACON_DOMAIN, beacon))), 0)
        body = RolloutAssignBody(job=job, worker=worker.peer, attempt=0, round=0,
                                 deadline_ms=1_000)
        assigned.append(worker.handle(Received(learner.peer_id, RolloutAssign(
            envelope=seal(learner, RL_ASSIGN_DOMAIN, body))), 0))
    assert [starts(a) for a in assigned] == [[(jobs[0].job_id, 1_000)], [], []]
    assert worker.busy() == 3 and worker.next_deadline() == 1_000
    # the learner withdraws the third while it waits: it never starts
    assert worker.handle(Received(learner.peer_id, RolloutCancel(
        job_id=jobs[2].job_id, attempt=0)), 100) == []
    # the first finishes at 800: the second starts then, due 1 000 ms later
    done = worker.handle(RolloutDone(jobs[0].job_id, 0, honest_result(jobs[0])), 800)
    assert starts(done) == [(jobs[1].job_id, 1_800)]
    assert not [e for e in worker.handle(Tick(), 1_500) if isinstance(e, CancelRollout)]
    assert worker.handle(Tick(), 1_800) == [CancelRollout(jobs[1].job_id, 0)]
    assert "jobs_overrun" in worker.counters and worker.counters["jobs_started"] == 2
