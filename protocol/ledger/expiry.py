"""Lazy expiry heaps: entries ``(due_at_ms, ...)`` pushed when a record or attestation is
stored and popped once due. An entry whose item was replaced or removed meanwhile stays in the
heap; whoever pops it checks that it still names the item held (by its hash)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any, TypeVar

Entry = TypeVar("Entry", bound=tuple[Any, ...])


def pop_due(heap: list[Entry], now_ms: int) -> Iterator[Entry]:
    """Pop and yield, soonest first, every entry of ``heap`` due at ``now_ms``."""
    while heap and heap[0][0] <= now_ms:
        yield heapq.heappop(heap)


def soonest(heap: list[Entry]) -> int | None:
    """When the first entry of ``heap`` is due (None: empty)."""
    return heap[0][0] if heap else None
