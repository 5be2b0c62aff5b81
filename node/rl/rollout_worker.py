"""The rollout worker in the daemon (``[rl_worker]``): drives protocol/rl/worker.py.

* Owns the rollout beacon topic and ``RolloutBeacon``, ``RolloutAssign``, ``RolloutCancel``:
  it bids on jobs for the model and policy versions its generator holds, and runs the jobs it
  is assigned.
* Generation goes to a *generator* in a worker thread (``trio.to_thread``), so the event loop
  never stalls; its result comes back to the machine as ``RolloutDone`` (``RolloutFailed``
  if it raised), and ``CancelRollout`` stops waiting for it.
* A generator is any object with ``model`` (name), ``model_hash`` (bytes), ``tokens_per_s``
  (measured), ``versions() -> Collection[int]`` (policy versions it can generate with now) and
  ``generate_group(job, *, worker, attempt) -> RolloutResultBody`` (blocking). The
  ``generator`` setting names a factory ``"module:callable"`` taking ``(section, data_dir)``
  (tests load their own this way); ``"models"`` is the real one: models/rl/rollout.py's
  llama.cpp worker on the ``environment`` named (:func:`models_generator`). A generator may
  say how many jobs it runs at once (``parallel``; the builtin one runs one): the other
  assigned jobs wait in the machine's queue, and each one's deadline starts when it leaves it
  (protocol/rl/worker.py), not while it waits behind another.
  ``generator = ""`` (the default) means this node takes no rollout jobs, and says so in its
  status.
* A generator that also has ``add_adapter(version, path, sha256)`` follows the learner's
  policy through the weight relay (node/rl/dissemination.py): each adapter version that
  completes in this node's relay is loaded and switched to without reloading the base model.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any, ClassVar, Protocol

import trio

from node import plugins
from node.rl.dissemination import AdapterFollower, run_model_name
from node.sections import fed_config, tuning
from node.service import JobScopes, NodeContext, NurseryService
from protocol.rl.events import (
    CancelRollout,
    LearnerSeen,
    RolloutDone,
    RolloutFailed,
    StartRollout,
)
from protocol.rl.messages import (
    RL_BEACON_TOPIC,
    RolloutAssign,
    RolloutBeacon,
    RolloutCancel,
    RolloutJob,
    RolloutResultBody,
)
from protocol.rl.worker import RolloutWorkerMachine, WorkerConfig

BUILTIN_GENERATORS = {"models": "node.rl.rollout_worker:models_generator"}
MAX_FAILURE_TEXT = 120
#: tokens generated once at start to measure the builtin generator's speed
SPEED_PROBE_TOKENS = 16


class Generator(Protocol):
    model: str
    model_hash: bytes
    tokens_per_s: float

    def versions(self) -> Collection[int]: ...

    def generate_group(self, job: RolloutJob, *, worker: str,
                       attempt: int) -> RolloutResultBody: ...


@tuning(WorkerConfig, "slots", "hold_ms", "price_per_1k")
class RlWorkerSection:
    """Tunables of the rollout worker (``[rl_worker]`` in node.toml)."""

    #: "" = take no rollout jobs; "models" = llama.cpp (models/rl/rollout.py); or
    #: "module:callable" building a generator from (section, data_dir)
    generator: str = ""
    #: with generator = "models": registry name or .gguf path ("" = the default model)
    model: str = ""
    #: with generator = "models": CPU threads (0 = one)
    threads: int = 0
    #: with generator = "models": the learner's environment ("evalset" or "module:factory")
    environment: str = "evalset"
    #: peer id of the only learner whose relayed adapters are taken ("" = the learners whose
    #: job announcements for this model the worker has seen)
    learner: str = ""

    def __post_init__(self) -> None:
        fed_config(self, model="")  # WorkerConfig checks slots and hold_ms
        if self.threads < 0 or self.price_per_1k < 0:
            raise ValueError("threads and price_per_1k must not be negative")
        plugins.check_choice("generator", self.generator, BUILTIN_GENERATORS)


class ModelsGenerator:
    """models/rl/rollout.py's llama.cpp worker answering jobs on the section's environment.

    Adapters relayed by the learner arrive from another thread (node/rl/dissemination.py):
    one lock keeps them and the jobs apart, and the versions held are a snapshot the event
    loop reads without waiting for a job to finish."""

    #: jobs generated at once: one lock serializes them (and adapter loads)
    parallel = 1

    def __init__(self, section: RlWorkerSection) -> None:
        from models.rl.env import load_environment
        from models.rl.rollout import RolloutWorker

        self.worker = RolloutWorker(section.model or None, n_threads=max(1, section.threads))
        self.env = load_environment(section.environment)
        self.model = run_model_name(section.model)
        self.model_hash = self.worker.model_hash()[:32]
        self.tokens_per_s = self._measure_speed()
        self._lock = threading.Lock()
        self._held = frozenset(self.worker.versions)

    def _measure_speed(self) -> float:
        """Tokens per second of one short sampled completion (what bids estimate from)."""
        from models.backend import SamplingParams

        prompt_ids = self.worker.backend.prompt_ids(self.env.prompt(0))
        t = time.perf_counter()
        done = self.worker.sample(prompt_ids, SamplingParams(
            max_tokens=SPEED_PROBE_TOKENS, temperature=1.0, ignore_eos=True))
        return len(done.token_ids) / max(time.perf_counter() - t, 1e-6)

    def versions(self) -> Collection[int]:
        return self._held

    def add_adapter(self, version: int, path: Path, sha256: str) -> float:
        """Load a relayed adapter beside the base model and switch to it; seconds spent."""
        with self._lock:
            spent = self.worker.add_adapter(version, path, sha256) + self.worker.use(version)
            self._held = frozenset(self.worker.versions)
        return spent

    def generate_group(self, job: RolloutJob, *, worker: str,
                       attempt: int) -> RolloutResultBody:
        with self._lock:
            return self.worker.generate_group(job, self.env, worker=worker, attempt=attempt)


def models_generator(section: RlWorkerSection, data_dir: Path) -> Generator:
    return ModelsGenerator(section)


def load_generator(section: RlWorkerSection, data_dir: Path) -> Generator:
    generator: Generator = plugins.load(section.generator, BUILTIN_GENERATORS)(section, data_dir)
    return generator


class RolloutWorkerService(NurseryService):
    name: ClassVar[str] = "rl_worker"
    message_types = (RolloutBeacon, RolloutAssign, RolloutCancel)
    topics = (RL_BEACON_TOPIC,)
    config_section = RlWorkerSection

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.section: RlWorkerSection = ctx.config.section(self.name)
        self.generator: Generator | None = None
        self.problem = "no generator configured ([rl_worker] generator)"
        # a machine that never bids until a generator is up (its model name matches no job)
        self._machine = RolloutWorkerMachine(ctx.identity, WorkerConfig(model=""), lambda: ())
        self._jobs = JobScopes()
        self.generated = 0
        self.failed = 0
        self.follower: AdapterFollower | None = None

    @property
    def machine(self) -> RolloutWorkerMachine:
        return self._machine

    async def start(self) -> None:
        if not self.section.generator:
            return
        try:
            generator = await trio.to_thread.run_sync(  # loads weights: blocking
                load_generator, self.section, self.ctx.data_dir)
        except Exception as exc:  # a broken backend disables rollouts, not the node
            self.problem = f"generator {self.section.generator} failed to start: {exc}"
            self.ctx.log.exception("rl_worker.generator_failed")
            return
        s = self.section
        self.generator, self.problem = generator, ""
        self._machine.config = fed_config(
            s, model=generator.model, model_hash=generator.model_hash[:32],
            tokens_per_s=max(generator.tokens_per_s, 1e-3),
            parallel=min(s.slots, max(0, int(getattr(generator, "parallel", 0)))))
        self._machine.versions = generator.versions
        relay = self.ctx.services.get("relay")
        if hasattr(generator, "add_adapter") and relay is not None:
            self.follower = AdapterFollower(relay, generator,  # type: ignore[arg-type]
                                            Path(self.ctx.data_dir) / "rl_adapters",
                                            learner=s.learner,
                                            trusted=self._machine.learners.__contains__,
                                            log=self.ctx.log)
            self.follower.install()
        self.ctx.log.info("rl_worker.ready", model=generator.model,
                          versions=sorted(generator.versions()))

    async def on_running(self) -> None:
        """An adapter the relay kept from before a restart is loaded again."""
        if self.follower is not None:
            self.start_soon(self.follower.catch_up)

    async def perform(self, effect: object) -> None:
        if isinstance(effect, StartRollout):
            if not self.running or self.generator is None:
                await self.ctx.submit(self.name, RolloutFailed(
                    effect.job.job_id, effect.attempt, self.problem or "worker not running"))
                return
            scope = self._jobs.open((effect.job.job_id, effect.attempt))
            self.start_soon(self._generate, effect, scope)
        elif isinstance(effect, CancelRollout):
            self._jobs.cancel((effect.job_id, effect.attempt))
        elif isinstance(effect, LearnerSeen):
            if self.follower is not None:  # adapters it relayed before it was trusted
                self.start_soon(self.follower.catch_up, effect.learner)
        else:
            await super().perform(effect)

    async def _generate(self, start: StartRollout, scope: trio.CancelScope) -> None:
        generator = self.generator
        assert generator is not None  # perform() only starts jobs once it is up
        job = start.job
        event: RolloutDone | RolloutFailed | None = None
        with scope:
            try:
                # abandon_on_cancel: a cancelled job stops being waited for; the thread
                # finishes on its own and its result is dropped
                body = await trio.to_thread.run_sync(
                    functools.partial(generator.generate_group, job,
                                      worker=self.ctx.identity.peer_id, attempt=start.attempt),
                    abandon_on_cancel=True)
            except Exception as exc:
                self.failed += 1
                self.ctx.log.exception("rl_worker.generate_failed", job_id=job.job_id.hex())
                event = RolloutFailed(job.job_id, start.attempt,
                                      f"{type(exc).__name__}: {exc}"[:MAX_FAILURE_TEXT])
            else:
                self.generated += 1
                event = RolloutDone(job.job_id, start.attempt, body)
        self._jobs.close((job.job_id, start.attempt))
        if event is not None and not scope.cancelled_caught:
            await self.ctx.submit(self.name, event)

    def status(self) -> dict[str, Any]:
        m, g = self._machine, self.generator
        return {"enabled": g is not None, "problem": self.problem,
                "model": m.config.model, "versions": sorted(g.versions()) if g else [],
                "busy": m.busy(), "slots": m.config.slots, "generated": self.generated,
                "failed": self.failed, "counters": dict(sorted(m.counters.items())),
                "adapters": self.follower.status() if self.follower else None}
