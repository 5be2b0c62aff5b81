"""The bounded-staleness rule: accept v while training w iff 0 <= w - v <= S."""

from __future__ import annotations

import pytest

from protocol.errors import LocalProtocolError
from protocol.rl.staleness import MAX_STALENESS, accepts, lag, oldest_accepted


@pytest.mark.parametrize(
    ("version", "training", "bound", "expected"),
    [
        (5, 5, 0, True),  # synchronous: only the current version
        (4, 5, 0, False),
        (3, 5, 2, True),
        (2, 5, 2, False),
        (6, 5, 8, False),  # a version the learner has not published
        (0, 8, 8, True),
        (0, 9, 8, False),
    ],
)
def test_accepts_table(version: int, training: int, bound: int, expected: bool) -> None:
    assert accepts(version, training, bound) is expected


def test_oldest_accepted_matches_accepts() -> None:
    for bound in range(0, 6):
        for training in range(0, 12):
            oldest = oldest_accepted(training, bound)
            assert accepts(oldest, training, bound)
            if oldest > 0:
                assert not accepts(oldest - 1, training, bound)


@pytest.mark.parametrize("bound", [-1, MAX_STALENESS + 1, True, 1.0])
def test_bad_bound_is_a_local_error(bound: object) -> None:
    with pytest.raises(LocalProtocolError, match="staleness bound"):
        accepts(1, 1, bound)  # type: ignore[arg-type]


def test_negative_version_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError, match="versions"):
        lag(-1, 3)
