"""One RL run in virtual time: a learner fed by N rollout workers under a staleness bound S.

The learner's side is the protocol's own job book (protocol/rl/jobs.py): every job is issued,
assigned, judged (model-free validation, then the staleness rule of protocol/rl/staleness.py)
and reissued by it, exactly as the daemon's learner does; what the simulator adds is time:

* workers have heterogeneous speeds (a device mix of simulations/compute/cost.py ``DEVICES``): a
  job of G completions of L tokens takes ``G L / tokens_per_s`` (+-10% jitter); each worker
  keeps one job at a time; a job goes to the pick of the daemon's selector
  (protocol/market/selection.py: ``ExploringSelector`` over the score selector, as in
  node/rl/rollout_jobs.py) among the idle workers holding a usable version, each bidding
  its generation time as latency: the fastest, except the share of picks that go to workers
  never picked before;
* a new policy version reaches each worker after its dissemination time in the relay plan
  (protocol/relay/plan.py for the adapter's size and the workers' upload bandwidths: a peer
  at depth d completes after ``(size + d chunk) / rate`` plus d link latencies);
* a worker takes a job for the newest version it holds, if that version is still within S of
  the one being trained; otherwise (always, with S = 0, until the new version arrives) it waits;
* the learner keeps at most ``(S + 1) B`` rollouts issued or buffered, takes a step of T
  seconds once it holds B fresh ones (stale ones in its buffer are dropped), then publishes;
* churn: workers crash as a Poisson process (``crash_per_min`` of the live ones) and come back
  after ``restart_after_s``, fetching the newest version; a crashed worker's job is reissued
  when its deadline passes; cheaters (``cheater_share``) return groups for prompts of their
  choosing and are caught by validation, attested and excluded.

Figures: learner busy fraction (from its first step), steps, rollouts generated and wasted
as stale, catches and timeouts, and cost per step (the learner's hourly price for the whole
time plus every generated token at the worker's price), beside the capacity rule's prediction.
"""

from __future__ import annotations

import bisect
import math
from random import Random

from protocol.market.selection import Candidate, ExploringSelector, ScoreSelector
from protocol.rl.capacity import CapacityInputs, plan, rollouts_in_flight
from protocol.rl.jobs import ACCEPTED, INVALID, STALE, BookConfig, JobBook, Verdict
from protocol.rl.messages import Completion, RolloutJob, RolloutResultBody, RolloutSampling
from protocol.rl.prompts import job_prompts
from protocol.rl.staleness import accepts
from protocol.rl.validation import rollout_commitment
from simulations.compute.cost import DEVICES
from simulations.engine import US_PER_MS, US_PER_S, EventLoop
from simulations.rl.setup import RlFigures, RlSetup, SimWorker, dissemination_delays, pick

#: a completion as the simulator carries it: its timing uses ``tokens``, its content is short
_SIM_COMPLETION = Completion(token_ids=(1, 2, 3), logprobs=(-0.7, -1.2, -0.3), finished=True)
DATASET = 10_000
VOCAB = 49_152
#: how often the learner looks for jobs past their deadline
EXPIRE_EVERY_US = US_PER_S
#: weight of the newest job in the learner's running average of the job turnaround
TURNAROUND_WEIGHT = 0.05


class RlWorld:
    def __init__(self, setup: RlSetup, seed: int) -> None:
        self.setup = setup
        self.rng = Random(seed)
        self.loop = EventLoop()
        s = setup
        config = BookConfig(learner="learner", model="smollm2-135m", dataset_size=DATASET,
                            vocab_size=VOCAB, group_size=s.group_size,
                            sampling=RolloutSampling(temperature=1.0, top_p=1.0,
                                                     max_tokens=s.tokens),
                            max_staleness=s.staleness, job_ms=60_000)
        self.book = JobBook(config, Random(seed + 1))
        self.selector = ExploringSelector(ScoreSelector(), share=s.explore_share)
        uploads = [self._upload() for _ in range(s.workers)]
        delays = dissemination_delays(s, uploads, seed)
        self.workers: dict[str, SimWorker] = {}
        for i in range(s.workers):
            device = DEVICES[pick(self.rng, s.devices)]
            self.workers[f"w{i:05d}"] = SimWorker(
                f"w{i:05d}", device.tokens_per_s, device.price_per_1k, delays[i],
                self.rng.random() < s.cheater_share)
        self.ranked = sorted(self.workers.values(), key=lambda w: (-w.tokens_per_s, w.peer))
        #: idle live workers, fastest first: the order in which they are offered jobs
        self.idle: list[tuple[float, str]] = [(-w.tokens_per_s, w.peer) for w in self.ranked]
        self.pending: dict[bytes, RolloutJob] = {}
        self.buffer: list[int] = []  # policy version of each accepted rollout, oldest first
        self.training = False
        self.first_step_us: int | None = None
        self.step_started_us = 0
        self.busy_us = 0
        self.worker_cost = 0.0
        self.figures = RlFigures(workers=s.workers, staleness=s.staleness,
                                 dissemination_s=max(delays, default=0) / US_PER_S)
        speeds = [w.tokens_per_s for w in self.workers.values()]
        self.mean_tps = sum(speeds) / len(speeds) if speeds else 1.0
        #: measured time between the learner's steps (T when it never waits)
        self.interval_s = s.step_s
        self.last_step_us: int | None = None
        #: measured time from issuing a job to its result (an average over recent jobs)
        self.turnaround_s = s.group_size * s.tokens / self.mean_tps

    def _upload(self) -> float:
        table = tuple((str(i), share) for i, (share, _) in enumerate(self.setup.uploads))
        return self.setup.uploads[int(pick(self.rng, table))][1]

    # ------------------------------------------------------------ dispatch
    def _room(self) -> int:
        """Rollouts the learner may still issue: protocol/rl/capacity.py's in-flight rule from
        the measured job turnaround, less those issued or buffered."""
        s = self.setup
        issued = self.book.in_flight() * s.group_size
        most = rollouts_in_flight(s.batch, s.staleness, self.turnaround_s, s.step_s)
        return most - issued - len(self.buffer)

    def _target(self) -> int:
        """The version a rollout issued now will be trained at: the next step's, once the
        current step is under way."""
        return self.book.version + (1 if self.training else 0)

    def _dispatch(self) -> None:
        """Offer jobs while the learner has any to give, each to the selector's pick among
        the idle workers that may take one."""
        s = self.setup
        while self.pending or self._room() >= s.group_size:
            able = []
            for _, peer in self.idle:
                worker = self.workers[peer]
                if s.staleness and self._generation_s(worker) > s.staleness * self._pace_s():
                    break  # this one and every slower one is too slow for the bound
                if self._may_take(worker):
                    able.append(worker)
            if not able or not self._offer(self._pick(able)):
                return

    def _pick(self, able: list[SimWorker]) -> SimWorker:
        """The selector's pick among ``able``, as the rollout auction makes it from their bids:
        every bid is for the whole job, at the same price and reputation, with the worker's
        generation time as its latency."""
        job_ms = self.book.config.job_ms
        bids = [Candidate(peer=w.peer, match_score=1.0, reputation=0.5, price=0.0,
                          max_price=0.0, est_latency_ms=int(self._generation_s(w) * 1000),
                          deadline_ms=job_ms, load=0.0, free_slots=1) for w in able]
        return self.workers[self.selector.select(b"", bids, 1)[0].peer]

    def _may_take(self, worker: SimWorker) -> bool:
        return (worker.job is None and worker.alive and self.book.eligible(worker.peer)
                and accepts(worker.held, self._target(), self.setup.staleness)
                and not self._too_slow(worker))

    def _offer(self, worker: SimWorker) -> bool:
        """Give ``worker`` a job if it may take one and the learner has one to give."""
        if not self._may_take(worker):
            return False
        now_ms = self.loop.now_ms
        job = self._job_for(worker, now_ms)
        if job is None:
            return False
        worker.job = job
        self._set_idle(worker, False)
        gen_s = self._generation_s(worker) * self.rng.uniform(0.9, 1.1)
        due_ms = int(self.setup.deadline_factor * gen_s * 1000) + 5_000
        self.book.assign(job.job_id, worker.peer, now_ms, due_ms)
        start = self.setup.assign_ms * US_PER_MS
        self.loop.after(start + int(gen_s * US_PER_S), self._done, worker, job, worker.epoch,
                        self.loop.now_us)
        return True

    def _set_idle(self, worker: SimWorker, idle: bool) -> None:
        """Keep ``self.idle`` (sorted fastest first) in step with the worker's state."""
        key = (-worker.tokens_per_s, worker.peer)
        at = bisect.bisect_left(self.idle, key)
        present = at < len(self.idle) and self.idle[at] == key
        if idle and not present:
            self.idle.insert(at, key)
        elif not idle and present:
            del self.idle[at]

    def _too_slow(self, worker: SimWorker) -> bool:
        """With S > 0, a worker whose group would come back more than S versions behind (the
        learner stepping at its measured pace meanwhile) is not given one: its bid's latency
        is too long."""
        s = self.setup
        if s.staleness == 0:
            return False
        lag = self._target() - worker.held + self._generation_s(worker) / self._pace_s()
        return lag > s.staleness

    def _pace_s(self) -> float:
        """Seconds per version the learner is moving at: its measured step interval, or the
        time since its last step when that is longer (a starved learner is not stepping)."""
        since = (self.loop.now_us - (self.last_step_us or 0)) / US_PER_S
        return max(self.interval_s, since)

    def _job_for(self, worker: SimWorker, now_ms: int) -> RolloutJob | None:
        if self.pending:
            _, old = self.pending.popitem()
            if old.policy_version == worker.held:
                return old
            self.book.cancel(old.job_id)
            return self.book.new_job(now_ms, prompt_seed=old.prompt_seed, version=worker.held)
        if self._room() < self.setup.group_size:
            return None
        return self.book.new_job(now_ms, version=worker.held)

    def _generation_s(self, worker: SimWorker) -> float:
        return self.setup.group_size * self.setup.tokens / worker.tokens_per_s

    # ------------------------------------------------------------ results
    def _done(self, worker: SimWorker, job: RolloutJob, epoch: int, issued_us: int) -> None:
        if not worker.alive or worker.epoch != epoch:
            return  # crashed mid-job: the learner reissues it at its deadline
        worker.job = None
        self._set_idle(worker, True)
        s = self.setup
        self.figures.generated += s.group_size
        self.worker_cost += self._generation_s(worker) * s.worker_cost_per_h / 3600
        prompts = job_prompts(job)
        if worker.cheater:  # easy prompts of its own choosing
            prompts = tuple(range(len(prompts)))
        completions = (_SIM_COMPLETION,) * (job.prompts * s.group_size)
        body = RolloutResultBody(
            job_id=job.job_id, attempt=0, worker=worker.peer, policy_version=job.policy_version,
            prompt_indices=prompts, completions=completions, compute_ms=0,
            commitment=rollout_commitment(completions), model_hash=b"")
        self.loop.after(int(s.latency_ms * US_PER_MS), self._arrive_result, worker, body,
                        issued_us)
        self._dispatch()

    def _arrive_result(self, worker: SimWorker, body: RolloutResultBody, issued_us: int) -> None:
        verdict = self.book.receive(body, worker.peer, self.loop.now_ms)
        took_s = (self.loop.now_us - issued_us) / US_PER_S
        self.turnaround_s += TURNAROUND_WEIGHT * (took_s - self.turnaround_s)
        if verdict.outcome == ACCEPTED:
            self.buffer.extend([body.policy_version] * self.setup.group_size)
        elif verdict.outcome == STALE:
            self.figures.stale += self.setup.group_size
        elif verdict.outcome == INVALID:
            self.figures.caught += 1
            for job_id in verdict.cancelled:
                self._forget_job(job_id)
        self._take(verdict)
        self._try_step()
        self._dispatch()

    def _forget_job(self, job_id: bytes) -> None:
        for worker in self.workers.values():
            if worker.job is not None and worker.job.job_id == job_id:
                worker.job = None
                worker.epoch += 1
                self._set_idle(worker, True)

    def _take(self, verdict: Verdict) -> None:
        for job in verdict.reissued:
            self.pending[job.job_id] = job

    def _expire(self) -> None:
        for verdict in self.book.expire(self.loop.now_ms):
            self.pending.pop(verdict.job_id, None)
            if verdict.outcome == "timeout":
                self.figures.timeouts += 1
            self._take(verdict)
        self._dispatch()
        self.loop.after(EXPIRE_EVERY_US, self._expire)

    # ------------------------------------------------------------ learner
    def _try_step(self) -> None:
        if self.training:
            return
        w, bound = self.book.version, self.setup.staleness
        fresh = [v for v in self.buffer if accepts(v, w, bound)]
        self.figures.stale += len(self.buffer) - len(fresh)
        self.buffer = fresh
        if len(fresh) < self.setup.batch:
            return
        self.buffer = fresh[self.setup.batch:]
        self.training = True
        self.step_started_us = self.loop.now_us
        if self.last_step_us is not None:
            took_s = (self.loop.now_us - self.last_step_us) / US_PER_S
            self.interval_s += 0.3 * (took_s - self.interval_s)
        self.last_step_us = self.loop.now_us
        if self.first_step_us is None:
            self.first_step_us = self.loop.now_us
        self.loop.after(int(self.setup.step_s * US_PER_S), self._step_done)

    def _step_done(self) -> None:
        self.training = False
        self.busy_us += int(self.setup.step_s * US_PER_S)
        self.figures.steps += 1
        version = self.book.version + 1
        self.book.publish(version)
        for worker in self.workers.values():
            if worker.alive:
                self.loop.after(worker.delay_us, self._arrive_version, worker, version,
                                worker.epoch)
        self._try_step()
        self._dispatch()

    def _arrive_version(self, worker: SimWorker, version: int, epoch: int) -> None:
        if worker.alive and worker.epoch == epoch and version > worker.held:
            worker.held = version
            if self._may_take(worker) and (self.pending or self._room() >= self.setup.group_size):
                self._offer(self._pick([worker]))  # the only bidder holding it yet

    # ------------------------------------------------------------ churn
    def _crash_next(self) -> None:
        live = [w for w in self.ranked if w.alive]
        rate = self.setup.crash_per_min / 60 * len(live)
        if rate <= 0:
            return
        self.loop.after(int(self.rng.expovariate(rate) * US_PER_S) + 1, self._crash)

    def _crash(self) -> None:
        live = [w for w in self.ranked if w.alive]
        if live:
            worker = self.rng.choice(live)
            worker.alive, worker.job = False, None
            worker.epoch += 1
            self._set_idle(worker, False)
            self.loop.after(int(self.setup.restart_after_s * US_PER_S), self._restart, worker)
        self._crash_next()

    def _restart(self, worker: SimWorker) -> None:
        worker.alive = True
        self._set_idle(worker, True)
        self.loop.after(worker.delay_us, self._arrive_version, worker, self.book.version,
                        worker.epoch)
        self._dispatch()

    # ------------------------------------------------------------ run
    def run(self) -> RlFigures:
        end_us = int(self.setup.duration_s * US_PER_S)
        self.loop.at(0, self._dispatch)
        self.loop.at(EXPIRE_EVERY_US, self._expire)
        self._crash_next()
        self.loop.run(end_us)
        return self._figures(end_us)

    def _figures(self, end_us: int) -> RlFigures:
        f, s = self.figures, self.setup
        start = self.first_step_us if self.first_step_us is not None else end_us
        busy = self.busy_us + (end_us - self.step_started_us if self.training else 0)
        span = max(1, end_us - start)
        f.busy_fraction = min(1.0, busy / span) if self.first_step_us is not None else 0.0
        f.learner_idle_s = max(0.0, (span - busy) / US_PER_S)
        f.caught = len(self.book.excluded)
        f.cheaters = sum(w.cheater for w in self.workers.values())
        f.honest_excluded = sum(not self.workers[p].cheater for p in self.book.excluded)
        mean_tps = self.mean_tps
        f.rollouts_per_s = mean_tps / s.tokens
        f.generation_s = s.group_size * s.tokens / mean_tps
        learner_cost = s.learner_cost_per_h * end_us / US_PER_S / 3600
        f.cost_per_step = (learner_cost + self.worker_cost) / f.steps if f.steps else math.inf
        f.predicted = plan(CapacityInputs(workers=s.workers, rollouts_per_s=f.rollouts_per_s,
                                          batch=s.batch, step_s=s.step_s,
                                          dissemination_s=f.dissemination_s,
                                          generation_s=f.generation_s,
                                          staleness=s.staleness))
        return f


def run_rl(setup: RlSetup, seed: int) -> RlFigures:
    return RlWorld(setup, seed).run()
