"""simulations/runner/live.py: the swarm's live-node index agrees with a list of the live nodes, and
a churn pick through it is the pick a list would give, for the same draw."""

from __future__ import annotations

import random

import pytest

from simulations.runner.live import EligibleNodes, LiveNodes


@pytest.mark.parametrize("seed", range(8))
def test_live_nodes_match_a_list_of_them(seed: int) -> None:
    rng = random.Random(seed)
    live, flags = LiveNodes(), []
    for _ in range(400):
        if rng.random() < 0.3 or not flags:
            live.add()
            flags.append(False)
        else:
            i = rng.randrange(len(flags))
            flags[i] = rng.random() < 0.6
            live.set(i, flags[i])
        ups = [i for i, up in enumerate(flags) if up]
        assert live.count == len(ups), f"seed {seed}"
    assert [live.nth(k) for k in range(live.count)] == ups, f"seed {seed}"
    excluded = frozenset(rng.sample(range(len(flags)), 12))
    eligible = EligibleNodes(live, excluded)
    wanted = [i for i in ups if i not in excluded]
    assert list(eligible) == wanted, f"seed {seed}"
    for draw in range(20):
        assert random.Random(draw).choice(eligible) == random.Random(draw).choice(wanted)
    with pytest.raises(IndexError):
        live.nth(live.count)


def test_an_empty_choice_is_refused() -> None:
    live = LiveNodes()
    live.add()
    assert len(EligibleNodes(live, frozenset())) == 0
    live.set(0, True)
    assert len(EligibleNodes(live, frozenset({0}))) == 0
    assert list(EligibleNodes(live, frozenset())) == [0]
