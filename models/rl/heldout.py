"""The held-out split of an RL environment, and the accuracy of a policy version on it.

**The split** is models/rl/env.py's :func:`split` (its docstring gives the rule: about one
prompt in the environment's ``heldout_every``, chosen by a hash of its text). Training sees
only the other prompts: models/rl/env.py's :func:`load_environment` returns the training view,
whose indices are all a rollout job can name, so no job, learner or worker ever samples a
held-out prompt.

**The evaluation** (:func:`evaluate`) answers every held-out prompt (or the first ``prompts``
of them) with a llama.cpp worker (models/rl/rollout.py) under the base model or an adapter:
greedy by default (temperature 0, one answer per prompt), or ``samples`` draws per prompt at a
temperature, draw ``k`` of prompt ``i`` seeded by ``(seed, i, k)`` alone, so the base model and
an adapter answer with the same seeds. A completion is correct when the environment's
``correct(prompt, completion)`` says so (an environment without one: a reward above 0). The
accuracy's 95% interval is Wilson's (models/stats.py) over the prompts (draws of one prompt are
not independent, so n is the number of prompts, not of draws).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from models.backend import SamplingParams
from models.rl.env import SplitEnvironment
from models.rl.rollout import RolloutWorker
from models.stats import wilson_interval


@dataclass(frozen=True, slots=True)
class HeldoutScore:
    accuracy: float  # mean over prompts of the share of its draws that are correct
    low: float  # the Wilson 95% interval
    high: float
    prompts: int
    draws: int  # per prompt

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def as_dict(self) -> dict[str, float | int]:
        return {"accuracy": round(self.accuracy, 4), "ci95": [round(self.low, 4), round(self.high, 4)],
                "half_width": round(self.half_width, 4), "prompts": self.prompts,
                "draws": self.draws}


@dataclass(frozen=True, slots=True)
class EvalSettings:
    prompts: int = 0  # held-out prompts to answer; 0 = all of them
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy, one draw per prompt
    samples: int = 4  # draws per prompt when temperature > 0
    seed: int = 0


def evaluate(worker: RolloutWorker, heldout: SplitEnvironment, version: int,
             settings: EvalSettings = EvalSettings()) -> HeldoutScore:
    """The accuracy of ``worker`` under policy ``version`` (0 = the base; an adapter already
    added) on the held-out prompts."""
    worker.use(version)
    n = heldout.size if settings.prompts <= 0 else min(settings.prompts, heldout.size)
    draws = 1 if settings.temperature <= 0 else settings.samples
    total = 0.0
    for i in range(n):
        prompt_ids = worker.backend.prompt_ids(heldout.prompt(i))
        right = 0
        for k in range(draws):
            params = SamplingParams(max_tokens=settings.max_tokens,
                                    temperature=settings.temperature,
                                    seed=(settings.seed * 1_000_003 + i * 1009 + k) % (1 << 63))
            c = worker.sample(prompt_ids, params)
            text = worker.backend.detokenize([t for t in c.token_ids
                                              if t not in worker.backend.eos_ids])
            right += heldout.correct(i, text)
        total += right / draws
    low, high = wilson_interval(total, n)
    return HeldoutScore(accuracy=total / n, low=low, high=high, prompts=n, draws=draws)


class Evaluator:
    """A llama.cpp worker that scores policy versions on the held-out prompts: the base
    model, or an adapter file (added once by its hash, the last ``keep`` kept)."""

    def __init__(self, worker: RolloutWorker, heldout: SplitEnvironment,
                 settings: EvalSettings = EvalSettings()) -> None:
        self.worker, self.heldout, self.settings = worker, heldout, settings
        self._versions: dict[str, int] = {}  # adapter sha256 -> the worker's version for it

    def score(self, adapter: Path | None = None) -> HeldoutScore:
        if adapter is None:
            return evaluate(self.worker, self.heldout, 0, self.settings)
        sha = hashlib.sha256(adapter.read_bytes()).hexdigest()
        version = self._versions.get(sha)
        if version is None or version not in self.worker.versions:
            version = max(self.worker.versions) + 1
            self.worker.add_adapter(version, adapter, sha)
            self._versions[sha] = version
        return evaluate(self.worker, self.heldout, version, self.settings)

    def close(self) -> None:
        self.worker.close()


def score_adapter(evaluator: Evaluator, adapter: Path | None) -> dict[str, HeldoutScore]:
    """``{"base": ...}`` and, given an adapter file, ``{"adapter": ...}`` beside it: the same
    prompts with the same seeds under both."""
    scores = {"base": evaluator.score(None)}
    if adapter is not None:
        scores["adapter"] = evaluator.score(adapter)
    return scores
