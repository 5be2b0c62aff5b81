"""The learner's book of rollout jobs: issue, assign, judge returned groups, reissue.

Contract
--------
A job is OPEN when issued (no worker yet), RUNNING once assigned to a worker with a due
time, and ends ACCEPTED, STALE, INVALID, TIMED_OUT or CANCELLED; ``TRANSITIONS`` is the whole
table. :meth:`JobBook.receive` judges a group in this order:

1. a result for a job that is not RUNNING, or from a peer it was not assigned to, is
   ``unknown`` (the driver rejects it; a result naming someone else's job is a forgery);
2. a result from an excluded worker is ``excluded`` and its job reissued;
3. validation (protocol/rl/validation.py, then every extra ``GroupCheck`` the learner gives,
   e.g. log-prob recomputation): a failure is ``invalid``: an attestation against the worker,
   the worker excluded for the rest of the run (its other running jobs are cancelled and
   reissued), and the job reissued;
4. staleness (protocol/rl/staleness.py) against the version being trained: ``stale`` groups
   are dropped and counted, with no attestation (the learner moved on, not the worker);
5. otherwise ``accepted``, with a ``completed`` attestation.

:meth:`JobBook.convict` applies the same consequences as an ``invalid`` verdict to a group
already accepted, when a check the learner runs later (log-prob recomputation) fails.
:meth:`JobBook.expire` times out RUNNING jobs past their due time (attested ``timeout``) and
OPEN jobs nobody took within the job time; both are reissued. A reissued job covers the same
prompts (same seed) at the current version, under a new job id. The learner never waits past
a job's due time. Everything is pure: time comes in as ``now`` (ms), randomness from the
``Random`` given.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from random import Random

from protocol.codec import decode, encode
from protocol.errors import InvalidMessage, LocalProtocolError
from protocol.market.events import Attest
from protocol.market.messages import MAX_MODEL_NAME, MAX_TASK_MS, TASK_ID_LEN
from protocol.rl import attestations
from protocol.rl.messages import (
    MAX_DATASET,
    MAX_GROUP,
    MAX_PROMPTS_PER_JOB,
    MAX_RESULT_TOKENS,
    MAX_SEED,
    MAX_VOCAB,
    RolloutJob,
    RolloutResultBody,
    RolloutSampling,
)
from protocol.rl.staleness import accepts, check_bound
from protocol.rl.validation import GroupCheck, check_group


class JobState(enum.Enum):
    OPEN = "open"
    RUNNING = "running"
    ACCEPTED = "accepted"
    STALE = "stale"
    INVALID = "invalid"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.OPEN: frozenset({JobState.RUNNING, JobState.TIMED_OUT, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.ACCEPTED, JobState.STALE, JobState.INVALID,
                                 JobState.TIMED_OUT, JobState.CANCELLED}),
    JobState.ACCEPTED: frozenset(),
    JobState.STALE: frozenset(),
    JobState.INVALID: frozenset(),
    JobState.TIMED_OUT: frozenset(),
    JobState.CANCELLED: frozenset(),
}
#: accepted jobs remembered for a later conviction
MAX_JUDGED = 4096
#: verdict outcomes of :meth:`JobBook.receive`
ACCEPTED, STALE, INVALID, UNKNOWN, EXCLUDED = "accepted", "stale", "invalid", "unknown", "excluded"


@dataclass(frozen=True, slots=True)
class BookConfig:
    learner: str
    model: str
    #: prompts in the learner's environment
    dataset_size: int
    vocab_size: int
    prompts_per_job: int = 1
    group_size: int = 8
    sampling: RolloutSampling = RolloutSampling(temperature=1.0, top_p=1.0, max_tokens=256)
    #: the staleness bound S
    max_staleness: int = 0
    #: how long an issued job may stay without a worker, and a worker's default time for it
    job_ms: int = 120_000

    def __post_init__(self) -> None:
        """``ValueError`` naming what would make every job of this run malformed."""
        for name, hi in (("dataset_size", MAX_DATASET), ("prompts_per_job", MAX_PROMPTS_PER_JOB),
                         ("group_size", MAX_GROUP), ("vocab_size", MAX_VOCAB),
                         ("job_ms", MAX_TASK_MS)):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= hi:
                raise ValueError(f"{name} must be an int in [1, {hi}], got {value!r}")
        if not 1 <= len(self.model) <= MAX_MODEL_NAME:
            raise ValueError(f"model name must be 1 to {MAX_MODEL_NAME} characters (jobs carry "
                             f"it), got {len(self.model)}: {self.model[:80]!r}")
        if self.prompts_per_job > self.dataset_size:
            raise ValueError(f"prompts_per_job {self.prompts_per_job} exceeds dataset_size "
                             f"{self.dataset_size}")
        try:  # the bounds a worker's decoder applies to the sampling of every job
            decode(encode(self.sampling), RolloutSampling)
        except InvalidMessage as exc:
            raise ValueError(f"sampling: {exc}") from None
        tokens = self.prompts_per_job * self.group_size * self.sampling.max_tokens
        if tokens > MAX_RESULT_TOKENS:
            raise ValueError(f"prompts_per_job x group_size x max_tokens = {tokens} exceeds "
                             f"{MAX_RESULT_TOKENS} tokens per result")


@dataclass(slots=True)
class JobRecord:
    job: RolloutJob
    state: JobState
    issued_at_ms: int
    worker: str = ""
    due_at_ms: int = 0
    history: list[JobState] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str
    job_id: bytes
    worker: str = ""
    reason: str = ""
    attest: Attest | None = None
    #: new jobs standing in for the ones this verdict ended (same prompts, current version)
    reissued: tuple[RolloutJob, ...] = ()
    #: running jobs of an excluded worker, ended here: the driver cancels them with it
    cancelled: tuple[bytes, ...] = ()


def _move(record: JobRecord, to: JobState) -> None:
    if to not in TRANSITIONS[record.state]:
        raise LocalProtocolError(f"rollout job {record.job.job_id.hex()[:8]}: "
                                 f"{record.state} -> {to}")
    record.history.append(record.state)
    record.state = to


class JobBook:
    def __init__(self, config: BookConfig, rng: Random, checks: tuple[GroupCheck, ...] = (),
                 version: int = 0) -> None:
        check_bound(config.max_staleness)
        self.config = config
        self.rng = rng
        self.checks = checks
        #: the policy version being trained (w)
        self.version = version
        self.jobs: dict[bytes, JobRecord] = {}
        self.excluded: set[str] = set()
        #: accepted jobs and their workers, newest last, for :meth:`convict`
        self.judged: OrderedDict[bytes, tuple[RolloutJob, str]] = OrderedDict()
        self.counters: Counter[str] = Counter()

    # ------------------------------------------------------------ issuing
    def new_job(self, now: int, prompt_seed: int | None = None,
                version: int | None = None) -> RolloutJob:
        """A fresh job (a new seed unless one is given) for the current version, or for an
        older ``version`` still within the staleness bound (workers that hold only that one
        while the newest is on its way)."""
        c = self.config
        seed = self.rng.randint(0, MAX_SEED) if prompt_seed is None else prompt_seed
        if version is None:
            version = self.version
        elif not accepts(version, self.version, c.max_staleness):
            raise LocalProtocolError(f"a job for version {version} while training "
                                     f"{self.version} with S={c.max_staleness}")
        job = RolloutJob(job_id=self.rng.randbytes(TASK_ID_LEN), learner=c.learner,
                         model=c.model, policy_version=version, adapter_hash=b"",
                         prompt_seed=seed, dataset_size=c.dataset_size,
                         prompts=c.prompts_per_job, group_size=c.group_size,
                         sampling=c.sampling)
        job.check()
        self.jobs[job.job_id] = JobRecord(job=job, state=JobState.OPEN, issued_at_ms=now)
        self.counters["issued"] += 1
        return job

    def _reissue(self, record: JobRecord, now: int) -> RolloutJob:
        self.counters["reissued"] += 1
        return self.new_job(now, prompt_seed=record.job.prompt_seed)

    def assign(self, job_id: bytes, worker: str, now: int, due_in_ms: int) -> None:
        """The job went to ``worker``, who must answer within ``due_in_ms``."""
        record = self.jobs.get(job_id)
        if record is None:
            raise LocalProtocolError(f"assigning unknown rollout job {job_id.hex()[:8]}")
        if worker in self.excluded:
            raise LocalProtocolError(f"assigning a rollout job to excluded {worker}")
        _move(record, JobState.RUNNING)
        record.worker = worker
        record.due_at_ms = now + due_in_ms

    def cancel(self, job_id: bytes) -> None:
        """Drop a job that has not been answered (the learner withdraws it; no attestation)."""
        record = self.jobs.pop(job_id, None)
        if record is not None:
            _move(record, JobState.CANCELLED)
            self.counters["cancelled"] += 1

    def refused(self, job_id: bytes, sender: str, now: int) -> Verdict | None:
        """The worker running ``job_id`` refused it or failed: the job is reissued, with no
        attestation (None when ``sender`` runs no such job)."""
        record = self.jobs.get(job_id)
        if record is None or record.state is not JobState.RUNNING or record.worker != sender:
            return None
        return self._end(record, JobState.CANCELLED, "refused", "worker refused", None, now)

    def eligible(self, worker: str) -> bool:
        """Whether ``worker`` may still be chosen in this run (not caught cheating)."""
        return worker not in self.excluded

    def publish(self, version: int) -> None:
        """The learner now trains ``version`` (it only moves forward)."""
        if version < self.version:
            raise LocalProtocolError(f"version {version} is older than {self.version}")
        self.version = version

    # ------------------------------------------------------------ results
    def receive(self, result: RolloutResultBody, sender: str, now: int) -> Verdict:
        """Judge a returned group (see the module doc for the order of the checks)."""
        record = self.jobs.get(result.job_id)
        if record is None or record.state is not JobState.RUNNING or record.worker != sender:
            self.counters[UNKNOWN] += 1
            return Verdict(UNKNOWN, result.job_id, sender, "not a running job of this worker")
        job = record.job
        if sender in self.excluded:
            return self._end(record, JobState.CANCELLED, EXCLUDED, "worker excluded", None, now)
        reason = check_group(job, result, vocab_size=self.config.vocab_size)
        for check in self.checks:
            if reason is not None:
                break
            reason = check(job, result)
        if reason is not None:
            return self._catch(record, reason, now)
        if not accepts(result.policy_version, self.version, self.config.max_staleness):
            self.counters[STALE] += 1
            del self.jobs[job.job_id]
            _move(record, JobState.STALE)
            return Verdict(STALE, job.job_id, sender,
                           f"version {result.policy_version} while training {self.version}")
        self.counters[ACCEPTED] += 1
        _move(record, JobState.ACCEPTED)
        del self.jobs[job.job_id]
        self.judged[job.job_id] = (job, sender)
        while len(self.judged) > MAX_JUDGED:
            self.judged.popitem(last=False)
        return Verdict(ACCEPTED, job.job_id, sender, "",
                       attestations.accepted(sender, job.job_id))

    def _end(self, record: JobRecord, to: JobState, outcome: str, reason: str,
             attest: Attest | None, now: int) -> Verdict:
        _move(record, to)
        del self.jobs[record.job.job_id]
        self.counters[outcome] += 1
        return Verdict(outcome, record.job.job_id, record.worker, reason, attest,
                       (self._reissue(record, now),))

    def _catch(self, record: JobRecord, reason: str, now: int) -> Verdict:
        worker = record.worker
        verdict = self._end(record, JobState.INVALID, INVALID, reason,
                            attestations.invalid(worker, record.job.job_id, reason), now)
        return self._exclude(verdict, worker, now)

    def _exclude(self, verdict: Verdict, worker: str, now: int) -> Verdict:
        """Exclude ``worker`` for the run: its running jobs end and are reissued."""
        self.excluded.add(worker)
        others = [r for r in self.jobs.values()
                  if r.worker == worker and r.state is JobState.RUNNING]
        reissued = list(verdict.reissued)
        for other in others:
            _move(other, JobState.CANCELLED)
            del self.jobs[other.job.job_id]
            reissued.append(self._reissue(other, now))
        return replace(verdict, reissued=tuple(reissued),
                       cancelled=tuple(r.job.job_id for r in others))

    def convict(self, job_id: bytes, reason: str, now: int) -> Verdict | None:
        """A check run after acceptance (the learner's recomputation of log-probabilities
        under the job's version) failed for the group of ``job_id``: the same consequences as
        failing validation on arrival (attestation, exclusion, the job's prompts reissued).
        None when the job is not among the last ``MAX_JUDGED`` accepted ones."""
        judged = self.judged.pop(job_id, None)
        if judged is None:
            return None
        job, worker = judged
        self.counters["convicted"] += 1
        self.counters["reissued"] += 1
        verdict = Verdict(INVALID, job_id, worker, reason,
                          attestations.invalid(worker, job_id, reason),
                          (self.new_job(now, prompt_seed=job.prompt_seed),))
        return self._exclude(verdict, worker, now)

    # ------------------------------------------------------------ time
    def expire(self, now: int) -> list[Verdict]:
        """End every job past its time, each reissued; RUNNING ones are attested ``timeout``."""
        out: list[Verdict] = []
        for record in list(self.jobs.values()):
            if record.state is JobState.RUNNING and now >= record.due_at_ms:
                out.append(self._end(record, JobState.TIMED_OUT, "timeout", "deadline passed",
                                     attestations.timed_out(record.worker, record.job.job_id),
                                     now))
            elif (record.state is JobState.OPEN
                  and now >= record.issued_at_ms + self.config.job_ms):
                out.append(self._end(record, JobState.TIMED_OUT, "unassigned",
                                     "no worker took it", None, now))
        return out

    def next_deadline(self) -> int | None:
        times = [r.due_at_ms if r.state is JobState.RUNNING
                 else r.issued_at_ms + self.config.job_ms for r in self.jobs.values()]
        return min(times) if times else None

    def in_flight(self) -> int:
        return len(self.jobs)

    def running_for(self, worker: str) -> list[bytes]:
        return [j for j, r in self.jobs.items()
                if r.worker == worker and r.state is JobState.RUNNING]
