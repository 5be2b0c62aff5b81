"""The figures of a learner's steps that its daemon shows: the dashboard's reward curve.

Rewards are computed by the learner, never by the daemon (models/rl/env.py). With each version
it publishes (``POST /rl_jobs/version``, node/rl/rollout_jobs.py) the learner may send the mean
reward of the step that made that version and, where it measured one, a held-out accuracy.
It may send its telemetry too (:data:`TELEMETRY`: KL to the base, entropy, clip fraction,
staleness, rollout tokens/s), which ``/metrics`` shows. They come over the API, so they are
checked here (:func:`version_figures`, :func:`telemetry`: a bad value is a ``ValueError``
naming the field), and :class:`StepFigures` keeps the newest ``MAX_STEPS`` of
them, in memory only (a restarted daemon shows the steps published after it came back).
"""

from __future__ import annotations

import collections
import math
from typing import Any

#: learner steps whose figures the daemon keeps (the newest; the dashboard draws them)
MAX_STEPS = 200
#: environments set their own reward scale (the shipped one's is [0, 1.2]); a mean reward
#: larger in magnitude than this is refused as a learner's error rather than drawn
MAX_ABS_REWARD = 1e6


def figure(data: dict[str, Any], key: str, low: float, high: float) -> float | None:
    """``data[key]`` as a finite number in [low, high], None where absent; ``ValueError``
    names the field otherwise (a bool is not a number; JSON's NaN and Infinity are refused)."""
    value = data.get(key)
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{key} must be a finite number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def version_figures(data: dict[str, Any], current: int) -> tuple[int, float | None, float | None]:
    """A ``POST /rl_jobs/version`` body's ``version`` (an int, not older than ``current``),
    ``mean_reward`` (|r| <= MAX_ABS_REWARD) and ``heldout_accuracy`` (in [0, 1], only beside a
    mean reward); ``ValueError`` names the bad field."""
    version = data.get("version")
    if type(version) is not int or version < current:
        raise ValueError("expected {\"version\": int}, not older than the current one")
    reward = figure(data, "mean_reward", -MAX_ABS_REWARD, MAX_ABS_REWARD)
    accuracy = figure(data, "heldout_accuracy", 0.0, 1.0)
    if accuracy is not None and reward is None:
        raise ValueError("heldout_accuracy needs the step's mean_reward beside it")
    return version, reward, accuracy


#: the learner's telemetry a version may carry beside its mean reward, with each one's range:
#: KL to the base policy and the policy's entropy per token (nats), the share of tokens whose
#: importance ratio left the mask bounds, the largest staleness of the step's groups (versions)
#: and the rollout tokens per second the learner took in since its previous step
TELEMETRY: dict[str, tuple[float, float]] = {
    "kl": (0.0, 1e6), "entropy": (0.0, 1e3), "clip_fraction": (0.0, 1.0),
    "staleness": (0.0, 1e6), "rollout_tokens_per_s": (0.0, 1e12)}


def telemetry(data: dict[str, Any]) -> dict[str, float]:
    """The :data:`TELEMETRY` figures present in ``data``, checked; ``ValueError`` names a bad
    one."""
    out = {}
    for key, (low, high) in TELEMETRY.items():
        value = figure(data, key, low, high)
        if value is not None:
            out[key] = value
    return out


def step_telemetry(stats: Any) -> dict[str, float]:
    """A learner step's (node/rl/learner_trainer.py's StepStats) :data:`TELEMETRY` figures."""
    return {"kl": stats.kl, "entropy": stats.entropy, "clip_fraction": stats.clip_fraction,
            "staleness": float(max(stats.group_staleness, default=0)),
            "rollout_tokens_per_s": stats.rollout_tokens_per_s}


class StepFigures:
    """The newest ``most`` steps' figures, oldest first, one per version."""

    def __init__(self, most: int = MAX_STEPS) -> None:
        self._rows: collections.deque[dict[str, Any]] = collections.deque(maxlen=most)

    def record(self, version: int, mean_reward: float, heldout_accuracy: float | None = None,
               measured: dict[str, float] | None = None) -> None:
        """The figures of the step that made ``version`` (``measured``: its
        :data:`TELEMETRY`); a repeat of the last version replaces its figures."""
        if self._rows and self._rows[-1]["version"] == version:
            self._rows.pop()
        self._rows.append({"version": version, "mean_reward": mean_reward,
                           "heldout_accuracy": heldout_accuracy, **(measured or {})})

    def forget_after(self, version: int) -> None:
        """Drop the steps newer than ``version`` (a new run from it abandons them)."""
        while self._rows and self._rows[-1]["version"] > version:
            self._rows.pop()

    def rows(self) -> list[dict[str, Any]]:
        """``{"version", "mean_reward", "heldout_accuracy"}`` and the telemetry it came with,
        per step, oldest first."""
        return [dict(row) for row in self._rows]


class RolloutRate:
    """Rollout tokens/s as a learner reports it with each step: the completion tokens of the
    results it took in since it last started counting (its previous step, or its start),
    over the time since. One rule for the local learner (node/rl/learner.py) and the network
    one (node/rl/network_learner.py); ``now`` is a monotonic clock reading in seconds."""

    def __init__(self, now: float) -> None:
        self.tokens, self.since = 0, now

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def rate(self, now: float) -> float:
        return self.tokens / max(now - self.since, 1e-9)

    def restart(self, now: float) -> None:
        self.tokens, self.since = 0, now
