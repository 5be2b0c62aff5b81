"""The compute model: device profiles, a question bank with ground truth, and answers.

Contract
--------
* A :class:`DeviceProfile` is what a node's hardware offers: decode speed (tokens/s), memory
  and a price. Compute time of a task is ``tokens / tokens_per_s`` (plus a prefill share and
  a seeded jitter), so a slow device answers late and may miss its deadline exactly as a real
  one would.
* A :class:`Question` has a category, a difficulty, a true answer and a few *distractors*:
  the wrong answers executors actually give (models share mistakes, so wrong answers of
  different executors coincide, which is what makes voting non-trivial).
* :class:`CostModel` answers a ``StartCompute`` for a node from its :class:`ExecutorProfile`:
  correct with probability ``logistic(logit(skill[category]) - difficulty)``, else a
  distractor (the first ones more likely); a confidence drawn from the profile's calibration
  (a calibrated executor is confident when right, unsure when wrong; an uncalibrated one is
  equally confident either way); a CoT whose length follows the token count. Every draw comes
  from the rng handed in (the node's), so answers are reproducible from the seed.
* Alternatively :class:`SolverBackend` runs a real solver (node/market/executor.py's
  ``Solver`` protocol) synchronously, and simulations/compute/models_backend.py the models/ backend on
  the shipped evaluation set (``[compute] backend = "models"``): for small runs only.

The figures in ``DEVICES`` are illustrative orders of magnitude for a 1-8B model, not
measurements (the one measured figure, SmolLM2-135M on 2 CPU cores, is ARCHITECTURE.md's).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crypto.hashing import digest
from protocol.market.events import ComputeDone, ComputeFailed, StartCompute

#: answer type of the generated questions: compared by value, so "42" and "42.0" agree
ANSWER_TYPE = "number"
#: characters of chain-of-thought per generated token (English BPE averages ~4)
COT_CHARS_PER_TOKEN = 4
#: the CoT text carried on the wire is capped here (the token count is kept)
MAX_SIM_COT_CHARS = 2_048
#: prefill costs this fraction of a decode step per prompt token
PREFILL_FACTOR = 0.1
#: compute time jitter: uniform in [1 - j, 1 + j]
TIME_JITTER = 0.2
DISTRACTORS = 3


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    name: str
    tokens_per_s: float
    memory_gb: float
    price_per_1k: float


DEVICES: dict[str, DeviceProfile] = {
    "cpu": DeviceProfile("cpu", 37.0, 8.0, 0.0),  # SmolLM2-135M Q4 on 2 cores (ARCHITECTURE.md)
    "laptop-gpu": DeviceProfile("laptop-gpu", 45.0, 8.0, 0.05),
    "rtx3090": DeviceProfile("rtx3090", 110.0, 24.0, 0.10),
    "rtx4090": DeviceProfile("rtx4090", 160.0, 24.0, 0.15),
    "a100": DeviceProfile("a100", 400.0, 80.0, 0.40),
}


@dataclass(frozen=True, slots=True)
class Question:
    qid: int
    text: str
    category: str
    difficulty: float
    truth: str
    distractors: tuple[str, ...]
    prompt_tokens: int
    answer_tokens: int
    #: protocol.answers.AnswerType value; ``truth`` is already normalized for it
    answer_type: str = ANSWER_TYPE
    choices: tuple[str, ...] = ()


def question_bank(rng: random.Random, count: int, categories: tuple[str, ...]) -> list[Question]:
    """``count`` questions with numeric answers, spread over ``categories``."""
    bank = []
    for qid in range(count):
        category = categories[qid % len(categories)]
        truth = rng.randrange(10, 10_000)
        wrong: list[int] = []
        while len(wrong) < DISTRACTORS:
            candidate = truth + rng.choice((-1, 1)) * rng.randrange(1, 50)
            if candidate != truth and candidate not in wrong:
                wrong.append(candidate)
        bank.append(
            Question(
                qid=qid,
                text=f"[{category}] question {qid}: compute the value (answer with a number).",
                category=category,
                difficulty=rng.uniform(-1.0, 1.5),
                truth=str(truth),
                distractors=tuple(str(w) for w in wrong),
                prompt_tokens=rng.randrange(40, 200),
                answer_tokens=rng.randrange(80, 400),
            )
        )
    return bank


@dataclass(slots=True)
class ExecutorProfile:
    """How a node computes: its device, skill per category, calibration, failures."""

    device: DeviceProfile
    #: probability of a right answer on a question of difficulty 0, per category ("*": default)
    skill: dict[str, float] = field(default_factory=lambda: {"*": 0.7})
    #: 1: confidence tracks correctness; 0: it does not
    calibration: float = 0.7
    #: probability that a computation fails outright (ComputeFailed)
    fail_rate: float = 0.0
    #: when set, the node's compute never finishes (a hung agent)
    hung: bool = False
    #: verification cheat mode: "" honest, "swap" or "fabricate:<fraction>" (see
    #: simulations/machines/verification.py)
    cheat: str = ""
    label: str = "honest"

    def skill_for(self, category: str) -> float:
        return self.skill.get(category, self.skill.get("*", 0.5))


def _logit(p: float) -> float:
    p = min(0.999, max(0.001, p))
    return math.log(p / (1.0 - p))


def p_correct(skill: float, difficulty: float) -> float:
    return 1.0 / (1.0 + math.exp(-(_logit(skill) - difficulty)))


def model_hash(name: str) -> bytes:
    return digest(name.encode(), person=b"sim-weights")


ComputeOutcome = tuple[int, ComputeDone | ComputeFailed | None]


class CostModel:
    """Answers ``StartCompute`` from a question bank and the node's profile."""

    def __init__(self, questions: list[Question]) -> None:
        self.by_text = {q.text: q for q in questions}

    def question(self, text: str) -> Question | None:
        return self.by_text.get(text)

    def compute(
        self, profile: ExecutorProfile, job: StartCompute, rng: random.Random
    ) -> ComputeOutcome:
        """(duration in ms, the event to feed back; None: never finishes)."""
        q = self.by_text.get(job.task.question)
        prompt = q.prompt_tokens if q is not None else len(job.task.question) // 4
        tokens = min(q.answer_tokens if q is not None else 200, job.task.max_tokens)
        speed = profile.device.tokens_per_s
        seconds = (tokens + PREFILL_FACTOR * prompt) / speed
        duration_ms = max(1, int(seconds * 1000 * rng.uniform(1 - TIME_JITTER, 1 + TIME_JITTER)))
        tid, attempt = job.task.task_id, job.attempt
        if profile.hung:
            return duration_ms, None
        if profile.fail_rate and rng.random() < profile.fail_rate:
            return duration_ms // 2, ComputeFailed(tid, attempt, "simulated failure")
        answer, confidence = self.answer(profile, q, rng)
        cot_len = min(MAX_SIM_COT_CHARS, tokens * COT_CHARS_PER_TOKEN)
        cot = ("step " * (cot_len // 5 + 1))[:cot_len]
        return duration_ms, ComputeDone(
            task_id=tid,
            attempt=attempt,
            answer=answer,
            cot=cot,
            confidence=confidence,
            tokens=tokens,
            compute_ms=duration_ms,
            model_hash=model_hash(job.model),
        )

    @staticmethod
    def answer(
        profile: ExecutorProfile, q: Question | None, rng: random.Random
    ) -> tuple[str, float]:
        if q is None:
            return "0", 0.1
        correct = rng.random() < p_correct(profile.skill_for(q.category), q.difficulty)
        if correct:
            answer = q.truth
        else:  # the first distractor is the most common mistake
            answer = rng.choices(q.distractors, weights=(4, 2, 1)[: len(q.distractors)])[0]
        base = rng.uniform(0.3, 0.9)
        cal = profile.calibration
        confidence = (1 - cal) * base + cal * (
            rng.uniform(0.7, 1.0) if correct else rng.uniform(0.1, 0.5)
        )
        return answer, round(confidence, 4)


class SolverBackend:
    """Runs a real solver (``solve(task, model, max_tokens, attempt) -> ComputeDone``, as the
    daemon's executor does) inside the run; its result is fed back as it is."""

    def __init__(self, solver: Any, time_from: Callable[[Any], int] | None = None) -> None:
        self.solver = solver
        self.time_from = time_from or (lambda solution: int(solution.compute_ms))

    def compute(
        self, profile: ExecutorProfile, job: StartCompute, rng: random.Random
    ) -> ComputeOutcome:
        try:
            done = self.solver.solve(job.task, job.model, job.task.max_tokens, job.attempt)
        except Exception as exc:  # a solver failure is a failed computation, as in the daemon
            return 1, ComputeFailed(job.task.task_id, job.attempt, str(exc)[:120])
        return max(1, self.time_from(done)), done
