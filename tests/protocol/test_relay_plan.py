"""The relay plan: reachable, fan-out bounded, deterministic, optimal among its candidates."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from protocol.relay.plan import (
    DEFAULT_UPLOAD_BPS,
    MAX_FANOUT,
    PlanInputs,
    RelayPlan,
    build_plan,
    place_at_rate,
)

MB = 1 << 20
SEEDS = range(40)


def peers(n: int, bps: int | list[int]) -> list[tuple[str, int]]:
    rates = bps if isinstance(bps, list) else [bps] * n
    return [(f"p{i:03d}", rates[i]) for i in range(n)]


def check_tree(plan: RelayPlan, expected: set[str], max_fanout: int = MAX_FANOUT) -> None:
    assert set(plan.order) == expected | {plan.root}
    assert plan.order[0] == plan.root and plan.root not in plan.parent
    for peer in expected:
        # every peer reaches the root through parents, at its stated depth
        assert plan.ancestors(peer)[-1] == plan.root
        assert len(plan.ancestors(peer)) == plan.depth[peer]
        assert peer in plan.children[plan.parent[peer]]
    for node, kids in plan.children.items():
        assert len(kids) <= max_fanout
        assert all(plan.parent[k] == node for k in kids)
    assert sum(len(k) for k in plan.children.values()) == len(expected)


@pytest.mark.parametrize(
    "n, bps, root_bps, size, chunk, shape",
    [
        (0, 0, 0, 10 * MB, MB, "root only"),
        (1, 100 * MB, 100 * MB, 10 * MB, MB, "chain"),
        (7, 100 * MB, 100 * MB, 256 * MB, MB, "chain"),  # big file, few peers: depth is cheap
        (7, 100 * MB, 800 * MB, 256 * MB, MB, "star"),  # the root can feed everyone at once
        (200, 100 * MB, 100 * MB, 256 * MB, 4 * MB, "tree"),  # a chain would be 200 hops
        (30, 0, 0, 64 * MB, MB, "chain"),  # unknown bandwidths: all the default
    ],
)
def test_shapes(n: int, bps: int, root_bps: int, size: int, chunk: int, shape: str) -> None:
    plan = build_plan(PlanInputs("root", root_bps, peers(n, bps), total_size=size, chunk_size=chunk,
                                 seed=b"s"))
    check_tree(plan, {p for p, _ in peers(n, bps)})
    if shape == "chain":
        assert plan.max_fanout == 1 and plan.max_depth == n
    elif shape == "star":
        assert plan.max_depth == 1 and plan.max_fanout == n
    elif shape == "tree":
        assert 1 < plan.max_fanout <= MAX_FANOUT and plan.max_depth < 20
    else:
        assert plan.order == ("root",) and plan.max_depth == 0


def test_unknown_bandwidth_is_the_publishers() -> None:
    plan = build_plan(PlanInputs("root", 0, peers(3, 0), total_size=MB, chunk_size=MB, seed=b""))
    assert plan.rate_bps <= DEFAULT_UPLOAD_BPS
    # a capped publisher and silent peers: the peers are assumed as capped, so a chain (a
    # tree would split a peer's uplink between children it cannot feed at the full rate)
    capped = build_plan(PlanInputs("root", 8 * MB, peers(7, 0), total_size=16 * MB, chunk_size=MB,
                                   seed=b""))
    assert capped.max_fanout == 1


@pytest.mark.parametrize("seed", SEEDS)
def test_random_configurations_keep_the_invariants(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(1, 120)
    rates = [rng.choice([0, 5, 20, 50, 100, 400]) * MB for _ in range(n)]
    root_bps = rng.choice([10, 100, 1000]) * MB
    fanout = rng.randrange(1, MAX_FANOUT + 1)
    size, chunk = rng.randrange(1, 1024) * MB, rng.choice([MB // 4, MB, 4 * MB])
    recipients = peers(n, rates)
    plan = build_plan(
        PlanInputs(
            "root",
            root_bps,
            recipients,
            total_size=size,
            chunk_size=chunk,
            seed=bytes([seed]),
            max_fanout=fanout,
        ),
    )
    check_tree(plan, {p for p, _ in recipients}, fanout)
    # deterministic: any input order, duplicates and the root listed give the same plan
    shuffled = recipients[:] + recipients[:3] + [("root", 1)]
    rng.shuffle(shuffled)
    again = build_plan(
        PlanInputs(
            "root",
            root_bps,
            shuffled,
            total_size=size,
            chunk_size=chunk,
            seed=bytes([seed]),
            max_fanout=fanout,
        ),
    )
    assert again == plan
    # nobody is fed faster than its parent's upload allows at the plan's rate
    rate = Fraction(plan.rate_num, plan.rate_den)
    root_up = root_bps or DEFAULT_UPLOAD_BPS
    uploads = dict(recipients) | {"root": root_up}
    for node, kids in plan.children.items():
        up = uploads[node] or root_up
        assert len(kids) * rate <= up, (seed, node)
    # the bisection finds the same optimum as trying every candidate rate
    assert plan.estimated_ms == brute_force_ms(root_bps, recipients, size, chunk, fanout), seed


def brute_force_ms(
    root_bps: int, recipients: list[tuple[str, int]], size: int, chunk: int, fanout: int
) -> int:
    root_up = root_bps or DEFAULT_UPLOAD_BPS
    ups = [root_up] + sorted((b or root_up for _, b in recipients), reverse=True)
    best: Fraction | None = None
    for u in set(ups):
        for k in range(1, fanout + 1):
            rate = Fraction(u, k)
            if rate > ups[0]:
                continue
            parents = place_at_rate(ups, rate.numerator, rate.denominator, fanout)
            if parents is None:
                continue
            depth = [0] * len(ups)
            for j in range(1, len(ups)):
                depth[j] = depth[parents[j]] + 1
            t = (size + max(depth) * chunk) / rate
            best = t if best is None else min(best, t)
    assert best is not None
    return int(best * 1000)


def test_slow_peers_become_leaves() -> None:
    recipients = peers(6, [100 * MB] * 3 + [MB] * 3)
    plan = build_plan(PlanInputs("root", 100 * MB, recipients, total_size=64 * MB, chunk_size=MB,
                                 seed=b""))
    for slow in ("p003", "p004", "p005"):
        assert plan.children[slow] == () or plan.rate_bps <= MB


def test_seed_rotates_the_deep_positions() -> None:
    recipients = peers(8, 100 * MB)
    orders = {
        build_plan(
            PlanInputs("root", 100 * MB, recipients, total_size=256 * MB, chunk_size=MB,
                       seed=bytes([s]))
        ).order
        for s in range(6)
    }
    assert len(orders) > 1


def test_reattach_prefers_the_nearest_live_ancestor() -> None:
    plan = build_plan(
        PlanInputs("root", 100 * MB, peers(5, 100 * MB), total_size=256 * MB, chunk_size=MB,
                   seed=b"x")
    )
    chain = list(plan.order)  # root, a, b, c, d, e
    assert plan.max_fanout == 1
    c = chain[3]
    assert plan.sources_for(c)[:3] == [chain[2], chain[1], chain[0]]
    # parent dead: the grandparent; parent and grandparent dead: the root
    assert plan.sources_for(c, {chain[2]})[0] == chain[1]
    assert plan.sources_for(c, {chain[2], chain[1]})[0] == "root"
    # never its own subtree (they pull through it): that would deadlock
    assert not set(plan.sources_for(c)) & {chain[4], chain[5], c}
    # nobody alive above it and the root gone: nothing
    assert plan.sources_for(c, {chain[2], chain[1], "root"}) == []
    assert plan.sources_for("root") == []


def test_reattach_falls_back_to_other_branches() -> None:
    plan = build_plan(
        PlanInputs(
            "root",
            200 * MB,
            peers(6, 100 * MB),
            total_size=8 * MB,
            chunk_size=MB,
            seed=b"y",
            max_fanout=2,
        ),
    )
    leaf = max(plan.order, key=lambda p: plan.depth[p])
    dead = set(plan.ancestors(leaf)[:-1])  # every ancestor but the root...
    sources = plan.sources_for(leaf, dead | {"root"})  # ...and the root
    assert sources and not set(sources) & (dead | {"root", leaf})


def test_late_fetcher_prefers_leaves() -> None:
    plan = build_plan(
        PlanInputs("root", 100 * MB, peers(4, 100 * MB), total_size=256 * MB, chunk_size=MB,
                   seed=b"z")
    )
    sources = plan.sources_for("stranger")
    assert sources[-1] == "root"
    assert [plan.depth[p] for p in sources] == sorted(
        (plan.depth[p] for p in sources), reverse=True
    )
    assert plan.sources_for("stranger", {sources[0]})[0] == sources[1]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        build_plan(PlanInputs("root", 1, [], total_size=0, chunk_size=1, seed=b""))
    with pytest.raises(ValueError):
        build_plan(PlanInputs("root", 1, [], total_size=1, chunk_size=1, seed=b"", max_fanout=0))
