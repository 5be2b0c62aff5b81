"""LinUCB: converges on a synthetic bandit, regret grows sublinearly, delayed rewards, state."""

from __future__ import annotations

import functools
import json
import math
import random

import pytest

from protocol.market.linucb import FEATURES, LinUCB, LinUCBSelector, features
from protocol.market.selection import Candidate

SEED = 20240611
D = 4
ROUNDS = 2000


@functools.cache
def synthetic_run(seed: int, rounds: int, delay: int) -> tuple[list[float], list[int], float]:
    """5 arms with hidden theta; rewards = theta.x + noise, delivered ``delay`` rounds late.

    Returns per-round regret, whether the best arm was picked, and the total regret a uniformly
    random policy would have had on the same contexts.
    """
    rng = random.Random(seed)
    thetas = {f"arm{i}": [rng.uniform(-0.5, 0.5) for _ in range(D)] for i in range(5)}
    thetas["arm4"] = [0.6, 0.4, 0.3, 0.2]  # best on the (positive) contexts below
    bandit = LinUCB(D, alpha=0.5)
    regrets: list[float] = []
    picks: list[int] = []
    random_regret = 0.0
    queue: list[tuple[bytes, str, float]] = []
    for t in range(rounds):
        contexts = {a: [1.0, *(rng.uniform(0.0, 1.0) for _ in range(D - 1))] for a in thetas}
        means = {a: sum(w * x for w, x in zip(thetas[a], contexts[a], strict=True)) for a in thetas}
        task = t.to_bytes(4, "big")
        (arm,) = bandit.choose(task, contexts, 1)
        picks.append(arm == max(means, key=lambda a: means[a]))
        regrets.append(max(means.values()) - means[arm])
        random_regret += max(means.values()) - sum(means.values()) / len(means)
        queue.append((task, arm, means[arm] + rng.gauss(0.0, 0.1)))
        if len(queue) > delay:
            bandit.reward(*queue.pop(0))
    return regrets, picks, random_regret


def test_converges_to_the_best_arm() -> None:
    _, picks, _ = synthetic_run(SEED, ROUNDS, delay=5)
    late = picks[-500:]
    assert sum(late) / len(late) > 0.85, f"seed {SEED}"


def test_regret_grows_sublinearly() -> None:
    regrets, _, random_regret = synthetic_run(SEED, ROUNDS, delay=5)
    quarter = ROUNDS // 4
    first, last = sum(regrets[:quarter]), sum(regrets[-quarter:])
    assert last < 0.35 * first, f"seed {SEED}: first quarter {first:.1f}, last {last:.1f}"
    # cumulative regret stays far under a uniformly random policy's (which grows linearly)
    assert sum(regrets) < 0.2 * random_regret


def test_delayed_rewards_match_by_task_and_are_applied_once() -> None:
    b = LinUCB(2)
    b.choose(b"t1", {"a": [1.0, 0.0], "b": [1.0, 1.0]}, 2)
    assert set(b.pending[b"t1".hex()]) == {"a", "b"}
    assert b.reward(b"t1", "a", 1.0)
    assert not b.reward(b"t1", "a", 1.0)  # already applied
    assert not b.reward(b"t2", "b", 1.0)  # unknown task
    assert b.arms["a"].pulls == 1 and b.arms["b"].pulls == 0
    assert b.theta("a")[0] > 0


def test_untried_arms_are_explored_first() -> None:
    b = LinUCB(2, alpha=1.0)
    for i in range(20):
        b.choose(bytes([i]), {"old": [1.0, 1.0]}, 1)
        b.reward(bytes([i]), "old", 0.5)
    assert b.choose(b"new", {"old": [1.0, 1.0], "new": [1.0, 1.0]}, 1) == ["new"]


def test_state_round_trips_through_json() -> None:
    b = LinUCB(3, alpha=0.7, ridge=2.0)
    for i in range(30):
        b.choose(bytes([i]), {"x": [1.0, i / 30, 0.5], "y": [1.0, 0.2, 0.1]}, 1)
        if i % 3:
            b.reward(bytes([i]), "x", 1.0)
            b.reward(bytes([i]), "y", 0.0)
    restored = LinUCB.from_dict(json.loads(json.dumps(b.to_dict())))
    x = [1.0, 0.3, 0.4]
    for arm in ("x", "y"):
        assert restored.ucb(arm, x) == pytest.approx(b.ucb(arm, x))
    assert restored.pending == b.pending and restored.alpha == 0.7


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(version=99),
    lambda d: d.pop("arms"),
    lambda d: d["arms"].update(bad={"a_inv": [[1.0]], "b": [0.0], "pulls": 0, "last_used": 0}),
    lambda d: d.update(dim="3"),
])
def test_malformed_state_is_refused(mutate) -> None:  # type: ignore[no-untyped-def]
    d = LinUCB(3).to_dict()
    mutate(d)
    with pytest.raises(ValueError):
        LinUCB.from_dict(d)


def test_state_is_bounded() -> None:
    b = LinUCB(2, max_arms=3, max_pending=2)
    for i in range(10):
        b.choose(bytes([i]), {f"arm{i}": [1.0, 0.0]}, 1)
    assert len(b.arms) <= 3 and len(b.pending) == 2


def test_selector_features_and_choice() -> None:
    c = Candidate(peer="p", match_score=0.8, reputation=0.6, price=2.0, max_price=4.0,
                  est_latency_ms=2_500, deadline_ms=10_000, load=0.25, free_slots=3)
    assert features(c) == pytest.approx([1.0, 0.8, 0.6, 0.75, 0.75, 0.5])
    assert len(FEATURES) == len(features(c))
    sel = LinUCBSelector()
    picked = sel.select(b"t", [c, c], 2)
    assert [p.peer for p in picked] == ["p"]
    sel.observe(b"t", "p", 5.0)  # clamped to 1
    assert sel.model.arms["p"].pulls == 1 and not math.isnan(sel.model.theta("p")[0])
