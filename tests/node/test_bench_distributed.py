"""`symphony bench distributed`'s helpers (the bench itself starts chains of daemons: it is run
by hand, its figures reported in the README)."""

from __future__ import annotations

import pytest

from node.bench import BENCHMARKS
from node.bench.distributed.testnet import split


@pytest.mark.parametrize(("blocks", "stages"), [(30, 2), (30, 4), (7, 3), (5, 5)])
def test_split_covers_every_block_once_in_nearly_equal_ranges(blocks: int, stages: int) -> None:
    ranges = split(blocks, stages)
    assert len(ranges) == stages and ranges[0][0] == 0 and ranges[-1][1] == blocks
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    sizes = [b - a for a, b in ranges]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_the_bench_is_registered() -> None:
    assert BENCHMARKS["distributed"] == "node.bench.distributed.bench"

