"""The real models/ backend as the simulator's compute: real answers to real questions.

Contract
--------
* ``[compute] backend = "models"`` (simulations/scenario.py) puts :class:`ModelsCompute` where
  the cost model would answer ``StartCompute``; market workloads then ask the shipped
  evaluation set (models/evalset.py) instead of the synthetic bank (:func:`evalset_questions`).
* One model per process and spec: loaded on first use and shared by every executor of every
  run (the simulator is single-threaded, so calls never overlap).
* Each executor answers through its own ``models.solver.ModelsSolver`` over that model,
  salted from its node's rng (derived from the scenario seed): at temperature > 0 the k
  executors of a task sample k different chains, as k daemons would, and the same scenario and
  seed give the same answers (on one machine, thread count and library versions: see
  models/backend.py on determinism).
* Virtual compute time: with ``time = "tokens"`` (generated tokens + ``PREFILL_FACTOR`` x
  prompt tokens) / the device's tokens/s, with the cost model's jitter: reproducible. With
  ``time = "measured"`` the solve's wall-clock ``compute_ms`` on this host (the device profile's
  speed is then ignored), which makes reports differ run to run. ``ComputeDone.compute_ms``
  carries the same figure as the delay.
* Results are the solver's own ``ComputeDone``, as in the daemon, with the virtual compute time
  and the hash of the model the executors advertise (the simulated name), so the auction's
  model check holds; the real model's identity is :attr:`ModelsCompute.identity`.
* A profile's ``hung`` and ``fail_rate`` act as with the cost model; skill and calibration do
  not (the model is what it is).
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Any

from protocol.answers import AnswerType, normalize_answer
from protocol.market.events import ComputeFailed, StartCompute
from simulations.compute.cost import (
    DISTRACTORS,
    PREFILL_FACTOR,
    TIME_JITTER,
    ComputeOutcome,
    ExecutorProfile,
    Question,
    model_hash,
)
from simulations.scenario import ComputeSpec

if TYPE_CHECKING:
    from models.backend import Backend

#: characters per prompt token when estimating a question's prompt (English BPE ~4)
CHARS_PER_PROMPT_TOKEN = 4
#: chat template and CoT instructions around the question, in tokens (SmolLM2, models.cot)
PROMPT_OVERHEAD_TOKENS = 60
_SALT_BYTES = 16

#: (model spec, threads) -> the loaded backend, for the life of the process
_LOADED: dict[tuple[str, int], Backend] = {}


def shared_backend(model: str, threads: int) -> Backend:
    """The backend of ``model`` ("" = the embedded default), loaded once per process."""
    key = (model, threads)
    if key not in _LOADED:
        from models.config import DEFAULT_MODEL_NAME, ModelConfig
        from models.loader import load_backend

        _LOADED[key] = load_backend(
            ModelConfig(spec=model or DEFAULT_MODEL_NAME, n_threads=threads)
        )
    return _LOADED[key]


def evalset_questions() -> list[Question]:
    """models/data/evalset.jsonl as questions, ``truth`` normalized as the daemon's vote does."""
    from models.evalset import load_evalset

    out = []
    for qid, item in enumerate(load_evalset()):
        problem = item.problem
        kind = problem.answer_type
        truth = normalize_answer(kind, item.answer, problem.choices)
        if truth is None:
            raise ValueError(f"evalset item {item.id}: answer {item.answer!r} does not normalize")
        out.append(
            Question(
                qid=qid,
                text=problem.question,
                category=kind.value,
                difficulty=0.0,
                truth=truth,
                distractors=_distractors(kind, truth, len(problem.choices)),
                prompt_tokens=len(problem.question) // CHARS_PER_PROMPT_TOKEN
                + PROMPT_OVERHEAD_TOKENS,
                answer_tokens=0,
                answer_type=kind.value,
                choices=problem.choices,
            )
        )
    return out


def _distractors(kind: AnswerType, truth: str, n_choices: int) -> tuple[str, ...]:
    """Wrong answers for the adversaries that rewrite answers (simulations/machines/adversary.py)."""
    if kind is AnswerType.CHOICE:
        letters = [chr(ord("A") + i) for i in range(n_choices)]
        return tuple(x for x in letters if x != truth)[:DISTRACTORS]
    if kind is AnswerType.NUMBER:
        value = int(float(truth))
        return tuple(str(value + d) for d in (1, -1, 10)[:DISTRACTORS])
    return ("unknown",)


class ModelsCompute:
    """Answers ``StartCompute`` with the real model; one salted solver per executor."""

    def __init__(self, spec: ComputeSpec) -> None:
        self.spec = spec
        self.backend = shared_backend(spec.model, spec.threads)
        #: the real model's registry name and identity hash (for the report)
        self.identity = f"{self.backend.info.name} {self.backend.identity_hash[:16]}"
        #: id(profile) -> (the profile, kept alive so its id stays its own; its solver)
        self._solvers: dict[int, tuple[ExecutorProfile, Any]] = {}
        self.solves = 0
        self.measured_ms = 0

    def _solver(self, profile: ExecutorProfile, rng: random.Random) -> Any:
        held = self._solvers.get(id(profile))
        if held is None:
            from models.solver import ModelsSolver

            solver = ModelsSolver(
                self.backend, temperature=self.spec.temperature, salt=rng.randbytes(_SALT_BYTES)
            )
            held = self._solvers[id(profile)] = (profile, solver)
        return held[1]

    def compute(
        self, profile: ExecutorProfile, job: StartCompute, rng: random.Random
    ) -> ComputeOutcome:
        """(duration in ms, the event to feed back; None: never finishes)."""
        solver = self._solver(profile, rng)
        tid, attempt = job.task.task_id, job.attempt
        jitter = rng.uniform(1 - TIME_JITTER, 1 + TIME_JITTER)
        if profile.hung:
            return 60_000, None
        if profile.fail_rate and rng.random() < profile.fail_rate:
            return 1_000, ComputeFailed(tid, attempt, "simulated failure")
        budget = min(job.task.max_tokens, self.spec.max_tokens)
        try:
            done = solver.solve(job.task, job.model, budget, attempt)
        except Exception as exc:  # a solver failure is a failed computation, as in the daemon
            return 1, ComputeFailed(tid, attempt, str(exc)[:120])
        self.solves += 1
        self.measured_ms += done.compute_ms
        if self.spec.time == "measured":
            duration_ms = max(1, int(done.compute_ms))
        else:
            prompt = len(job.task.question) // CHARS_PER_PROMPT_TOKEN + PROMPT_OVERHEAD_TOKENS
            seconds = (done.tokens + PREFILL_FACTOR * prompt) / profile.device.tokens_per_s
            duration_ms = max(1, int(seconds * 1000 * jitter))
        # the virtual node serves the model under its simulated name and hash
        return duration_ms, dataclasses.replace(
            done, compute_ms=duration_ms, model_hash=model_hash(job.model))
