"""The network model's gossip hop (the simulator's hot loop) agrees with its plain transfers."""

from __future__ import annotations

import random
from array import array

import pytest

from simulations.network import SMALL_MESSAGE_BYTES, LatencyModel, NetworkModel


def _pair(seed: int, rates: list[tuple[float, float]]) -> tuple[NetworkModel, NetworkModel]:
    made = []
    for _ in range(2):
        net = NetworkModel(
            random.Random(seed), latency=LatencyModel("lognormal", 40.0, 0.5, jitter_ms=5.0)
        )
        for up, down in rates:
            net.add_node(up, down)
        made.append(net)
    return made[0], made[1]


def _hop_by_transfers(
    net: NetworkModel,
    a: int,
    mesh: list[int],
    skip: int,
    arrival: array[int],
    size: int,
    now_us: int,
    rx_bytes: array[int],
    rx_msgs: array[int],
) -> tuple[list[tuple[int, int]], int]:
    """``flood_hop`` as its docstring states it: one ``transfer`` per copy, except a small
    copy to a node that has the message, which only counts as a duplicate."""
    first: list[tuple[int, int]] = []
    dups = 0
    for b in mesh:
        if b == skip:
            continue
        if size <= SMALL_MESSAGE_BYTES and arrival[b] == -1:
            dups += 1
            rx_bytes[b] += size
            rx_msgs[b] += 1
            continue
        for at in net.transfer(a, b, size, now_us):
            if arrival[b] == -1 or 0 < arrival[b] <= at + 1:
                dups += 1
                rx_bytes[b] += size
                rx_msgs[b] += 1
            else:
                arrival[b] = at + 1
                first.append((b, at))
    return first, dups


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("uniform", [True, False])
def test_flood_hop_is_transfer_per_copy(seed: int, uniform: bool) -> None:
    rng = random.Random(seed)
    n = 40
    rates = [
        (12_500_000.0, 12_500_000.0) if uniform else (rng.uniform(1e5, 2e7), rng.uniform(1e5, 2e7))
        for _ in range(n)
    ]
    fast, slow = _pair(seed, rates)
    arrival = array("q", [rng.choice((0, -1, 0, 5_000_000)) for _ in range(n)])
    arrival_slow = array("q", arrival)
    rx = [array("q", bytes(8 * n)) for _ in range(4)]
    now = 1_000_000
    for hop in range(30):
        a = rng.randrange(n)
        mesh = rng.sample(range(n), 8)
        skip = rng.choice(mesh + [-1])
        size = rng.choice((300, 4096, 50_000, 2_000_000))  # small copies and bulk transfers
        got = fast.flood_hop(a, mesh, skip, arrival, size, now, rx[0], rx[1])
        want = _hop_by_transfers(slow, a, mesh, skip, arrival_slow, size, now, rx[2], rx[3])
        assert got == want, f"seed {seed} hop {hop}"
        now += rng.randrange(0, 200_000)
    assert arrival == arrival_slow and rx[0] == rx[2] and rx[1] == rx[3]
    assert [fast.up_free_us(i) for i in range(n)] == [slow.up_free_us(i) for i in range(n)]
    assert fast.rng.random() == slow.rng.random()  # the same draws, in the same order
