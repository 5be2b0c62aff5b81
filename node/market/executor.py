"""The executor side of the task market in the daemon: drives protocol/market/executor.py.

* Owns the beacon topic and ``Beacon``, ``Assign`` and ``Cancel``: it bids on beacons its
  models match, within its free slots, and runs the tasks it is assigned.
* Computation goes to a *solver* in a worker thread (``trio.to_thread``), so the event loop
  never stalls; a finished one comes back to the machine as ``ComputeDone`` (or
  ``ComputeFailed`` if the solver raised), and ``CancelCompute`` stops waiting for it.
* A solver is any object with ``models() -> list[ServedModel]`` (names, context, weights
  hash, *measured* tokens/s; called once at start, in a thread) and
  ``solve(task: TaskSpec, model: str, max_tokens: int, attempt: int) -> ComputeDone``
  (blocking; the attempt picks the sampling seed, protocol.market.sampling); one with a
  ``fingerprints`` attribute gets it set to whether this executor commits (verification). The
  ``[executor] solver`` setting names a factory ``"module:callable"`` taking
  ``(section, data_dir)`` (any importable module: tests load their own double this way).
  The default, ``"models"``, is the real one (:func:`models_solver`: models/solver.py's
  solver on the models/ backend; ``model`` picks the model, "" = the embedded default), so a
  plain ``symphony node run`` executes. ``solver = ""`` opts out: the node never bids, and
  says so in its status and log; so does a solver that fails to start (e.g. models/ not
  installed), without stopping the node. The ``ComputeDone`` a solver returns goes to the
  machine as it is; one for another task or attempt, or no ``ComputeDone`` at all, is a
  ``ComputeFailed``. A solver whose ``solve`` also takes ``on_text`` (the builtin one) streams:
  it calls it from its thread with the text generated so far, and for a k=1 task whose
  assignment asks for it (``AssignBody.stream``) that text goes to the machine as
  ``ComputeProgress``, which sends it to the requester as unsigned progress frames
  (protocol/market/progress.py; node/market/text_pump.py paces them: one in flight at a
  time).
* Agents (node/agents/hosted.py): once the ledger service has published this node's agent
  cards (node.toml's ``[[agents]]``, or the default generalist), the executor bids with the
  best-fitting of them for each task (protocol/market/offers.py); before that, or with no
  ledger service (nobody could see its cards), it bids as the bare model. An assignment for
  an agent with tools or its own system prompt first runs its tool calls
  (``AgentRunner.context``: the operator's tool policy, the requester's peer id), then the
  solver answers with that context (``solve(..., system_prompt=, tool_calls=)``), which the
  result carries and verifiers rebuild; the default generalist answers with the solver's
  plain ``solve``, as before agents. An agent on a LoRA adapter (its card names the adapter's
  content hash) bids once node/agents/adapters.py has loaded the adapter into the solver
  (from its file, or fetched through the relay and checked against the hash), and answers
  with ``solve(..., adapter=)``; the status says for each such agent why it does not bid yet.
* Sampling is the requester's choice, carried by the task (temperature, top-p, seed base,
  stop strings); the executor has no temperature of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol

import trio

from node import plugins
from node.agents.adapters import ADAPTERS_DIR, AgentAdapters
from node.agents.hosted import AgentRunner
from node.market.text_pump import TextPump, shared_gap
from node.sections import fed_config, tuning
from node.service import JobScopes, NodeContext, NurseryService
from protocol.market.executor import (
    CancelCompute,
    ComputeDone,
    ComputeFailed,
    Executor,
    ExecutorConfig,
    ServedModel,
    StartCompute,
)
from protocol.market.jobs import JobState
from protocol.market.messages import (
    BEACON_TOPIC,
    Assign,
    Beacon,
    Cancel,
    TaskSpec,
)
from protocol.market.progress import ComputeProgress
from protocol.verification.executor import VerifiedExecutor

MAX_FAILURE_TEXT = 120
#: solver names that need no "module:callable"
BUILTIN_SOLVERS = {"models": "node.market.executor:models_solver"}


class Solver(Protocol):
    def models(self) -> list[ServedModel]: ...

    def solve(self, task: TaskSpec, model: str, max_tokens: int, attempt: int) -> ComputeDone:
        ...


@tuning(ExecutorConfig, "slots", "queue", "hold_ms", "max_tokens", "max_task_ms",
        "max_question_chars")
class ExecutorSection:
    """Tunables of the executor side (``[executor]`` in node.toml)."""

    #: "models" (models/solver.py), or "module:callable" building a solver from
    #: (section, data_dir); "" = do not execute
    solver: str = "models"
    #: with solver = "models": registry name, .gguf path or HF dir ("" = the default model)
    model: str = ""
    #: with solver = "models": CPU threads for the model (0 = the backend's default)
    threads: int = 0
    price_per_1k: float = 0.0

    def __post_init__(self) -> None:
        for name in ("slots", "hold_ms", "max_tokens", "max_task_ms", "max_question_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.queue < 0:
            raise ValueError("queue must not be negative (0 = no queue)")
        if self.price_per_1k < 0:
            raise ValueError("price_per_1k must not be negative")
        if self.threads < 0:
            raise ValueError("threads must not be negative (0 = the backend's default)")
        plugins.check_choice("solver", self.solver, BUILTIN_SOLVERS)


def models_solver(section: ExecutorSection, data_dir: Path) -> Solver:
    """The builtin solver: models/solver.py on ``section``'s model and threads, keeping
    committed layer states under ``data_dir`` for verifiers; with ``slots`` above 1 it
    decodes that many tasks at once in one batch (models/batched.py)."""
    from models.solver import load_models_solver
    from models.state_store import STATES_DIR

    return load_models_solver(section.model, threads=section.threads,
                              states_dir=data_dir / STATES_DIR, slots=section.slots)


def load_solver(spec: str, section: ExecutorSection, data_dir: Path) -> Solver:
    solver: Solver = plugins.load(spec, BUILTIN_SOLVERS)(section, data_dir)
    return solver


class ExecutorService(NurseryService):
    name: ClassVar[str] = "executor"
    message_types = (Beacon, Assign, Cancel)
    topics = (BEACON_TOPIC,)
    config_section = ExecutorSection

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.section: ExecutorSection = ctx.config.section(self.name)
        s = self.section
        from node.verification.service import executor_machine  # VerifiedExecutor if [verify] on

        # the models are the solver's, known once it has loaded them (start)
        self._machine = executor_machine(ctx, fed_config(s, models=()))
        self.solver: Solver | None = None
        self.problem = "no solver configured ([executor] solver)" if not s.solver else ""
        self._jobs = JobScopes()
        #: one solver thread per slot; trio holds a token until its thread has really ended,
        #: even one abandoned on cancel, so a job waits here (cancellable) rather than in a
        #: thread parked on the backend, which once free would run a job nobody wants
        self._threads = trio.CapacityLimiter(s.slots)
        #: k=1 jobs streaming their text now (they share the progress frames' pace)
        self._streaming = 0
        self.computed = 0
        self.streams = False
        self.failed = 0
        self.agents = AgentRunner()
        self.adapters: AgentAdapters | None = None

    @property
    def machine(self) -> Executor:
        return self._machine

    async def start(self) -> None:
        if not self.section.solver:
            self.ctx.log.warning("executor.disabled", reason=self.problem)
            return
        try:
            solver = await trio.to_thread.run_sync(  # imports and loads weights: blocking
                load_solver, self.section.solver, self.section, self.ctx.data_dir)
            if hasattr(solver, "fingerprints"):  # only a committing executor needs them
                solver.fingerprints = isinstance(self._machine, VerifiedExecutor)
            models = await trio.to_thread.run_sync(solver.models)
        except Exception as exc:  # a broken backend disables executing, not the node
            self.problem = f"solver {self.section.solver} failed to start: {exc}"
            self.ctx.log.exception("executor.solver_failed", solver=self.section.solver)
            return
        await trio.to_thread.run_sync(self.agents.start, solver)
        # a solver whose solve takes on_text streams a k=1 task's tokens (models/solver.py)
        self.streams = "on_text" in inspect.signature(solver.solve).parameters
        price = self.section.price_per_1k
        models = [dataclasses.replace(m, price_per_1k=price) for m in models]
        self.solver = solver
        self._machine.config = dataclasses.replace(self._machine.config, models=tuple(models))
        self.ctx.log.info("executor.ready", models=[m.name for m in models],
                          tokens_per_s=[round(m.tokens_per_s, 1) for m in models])

    async def on_running(self) -> None:
        self.start_soon(self._take_agents)

    async def _take_agents(self) -> None:
        """Bid with this node's agents once the ledger service has published their cards."""
        ledger = self.ctx.services.get("ledger")
        host = getattr(ledger, "agents", None)
        if host is None or self.solver is None:
            return
        await host.published.wait()
        self.agents.use(host.hosted, host.cards, ledger.tools.kit)  # type: ignore[union-attr]
        if self.agents.problem:
            self.ctx.log.warning("executor.agents_limited", problem=self.agents.problem)
        self.adapters = AgentAdapters(self.solver, self.ctx.services.get("relay"),
                                      self.ctx.data_dir / ADAPTERS_DIR, self.ctx.log,
                                      self._bid_agents)
        self.agents.adapters = self.adapters.loaded
        await self._bid_agents()
        await self.adapters.start(host.hosted)

    async def _bid_agents(self) -> None:
        """Bid with the agents that can run now (an adapter's agent once it is loaded)."""
        cards = self.agents.bid_cards()
        config = self._machine.config
        self._machine.config = dataclasses.replace(config, agents=cards,
                                                   tool_ms=self.agents.tool_ms(config.models))
        self.ctx.log.info("executor.agents", agents=[c.name for c in cards])

    async def perform(self, effect: object) -> None:
        if isinstance(effect, StartCompute):
            if not self.running or self.solver is None:
                await self.ctx.submit(self.name, ComputeFailed(
                    effect.task.task_id, effect.attempt, self.problem or "executor not running"))
                return
            scope = self._jobs.open((effect.task.task_id, effect.attempt))
            self.start_soon(self._compute, effect, scope)
        elif isinstance(effect, CancelCompute):
            self._jobs.cancel((effect.task_id, effect.attempt))
        else:
            await super().perform(effect)

    async def _compute(self, job: StartCompute, scope: trio.CancelScope) -> None:
        solver = self.solver
        assert solver is not None  # perform() only starts jobs once the solver is up
        key = (job.task.task_id, job.attempt)
        event: object | None = None
        with scope:
            try:
                solve = functools.partial(solver.solve, job.task, job.model,
                                          job.task.max_tokens, job.attempt)
                adapter = self.agents.adapter(job.agent)
                if adapter is not None:  # the agent's LoRA on the solver's model
                    solve = functools.partial(solve, adapter=adapter)
                context = await self.agents.context(job.agent, job.task)
                if context is not None:  # an agent's own prompt and tool calls
                    solve = functools.partial(solve, system_prompt=context[0],
                                              tool_calls=context[1])
                sol = await self._solve(job, solve)
            except Exception as exc:
                self.failed += 1
                self.ctx.log.exception("executor.solve_failed", task_id=job.task.task_id.hex())
                event = ComputeFailed(job.task.task_id, job.attempt,
                                      f"{type(exc).__name__}: {exc}"[:MAX_FAILURE_TEXT])
            else:
                event = self._checked(job, sol)
        self._jobs.close(key)
        if event is not None and not scope.cancelled_caught:
            await self.ctx.submit(self.name, event)

    async def _solve(self, job: StartCompute, solve: Callable[..., object]) -> object:
        """Run ``solve`` in a solver thread; a k=1 task's text goes to the machine as it
        grows (``ComputeProgress``: it sends the progress frames) when the solver streams."""
        # abandon_on_cancel: a cancelled job stops being waited for; the thread finishes on
        # its own and its result is dropped
        if not self.streams or job.task.k != 1 or not job.stream:
            return await trio.to_thread.run_sync(solve, abandon_on_cancel=True,
                                                 limiter=self._threads)
        pump = TextPump(lambda: shared_gap(self._streaming))

        async def progress(text: str) -> None:
            await self.ctx.submit(self.name, ComputeProgress(job.task.task_id, job.attempt, text))

        async def delivered() -> None:  # the frame, and anything queued before it, has left
            await self.ctx.drained(self.name, job.task.requester)

        failure: Exception | None = None
        sol: object = None
        self._streaming += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump.follow, progress, delivered)
                try:
                    sol = await trio.to_thread.run_sync(
                        functools.partial(solve, on_text=pump.push), abandon_on_cancel=True,
                        limiter=self._threads)
                except Exception as exc:  # raised as itself below, not in an exception group
                    failure = exc
                nursery.cancel_scope.cancel()
        finally:
            self._streaming -= 1
        if failure is not None:
            raise failure
        return sol

    def _checked(self, job: StartCompute, sol: object) -> ComputeDone | ComputeFailed:
        """The solver's result for ``job``, or a failure naming what it returned instead."""
        if (isinstance(sol, ComputeDone) and sol.task_id == job.task.task_id
                and sol.attempt == job.attempt):
            self.computed += 1
            return sol
        self.failed += 1
        what = (f"a result for task {sol.task_id.hex()} attempt {sol.attempt}"
                if isinstance(sol, ComputeDone) else type(sol).__name__)
        self.ctx.log.error("executor.solver_result_wrong", task_id=job.task.task_id.hex(),
                           got=what)
        return ComputeFailed(job.task.task_id, job.attempt,
                             f"solver returned {what}, not this job's ComputeDone"[
                                 :MAX_FAILURE_TEXT])

    def status(self) -> dict[str, Any]:
        m = self._machine
        running = [{"task_id": j.task_id.hex(), "attempt": j.attempt, "requester": j.requester,
                    "model": j.model, "agent": j.agent} for j in m.jobs.values() if j.state is JobState.RUNNING]
        return {
            "enabled": self.solver is not None, "problem": self.problem,
            "models": [{"name": x.name, "family": x.family, "quantization": x.quantization,
                        "context": x.context, "tokens_per_s": x.tokens_per_s,
                        "model_hash": x.model_hash.hex()}
                       for x in m.config.models],
            "agents": [{"name": c.name, "skills": list(c.skills),
                        "tools": [t.name for t in c.tools], "adapter": c.adapter}
                       for c in m.config.agents],
            "adapters": dict(self.adapters.states) if self.adapters is not None else {},
            "slots": m.config.slots, "free_slots": m.free_slots(), "running": running,
            "computed": self.computed, "failed": self.failed,
            "counters": dict(sorted(m.counters.items())),
        }
