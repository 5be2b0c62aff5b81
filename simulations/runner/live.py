"""Which nodes are up, as the swarm keeps them: how many, and the k-th in index order.

``LiveNodes`` is a Fenwick tree over one 0/1 flag per node: ``count`` is O(1), ``set`` and
``nth`` are O(log N). Churn picks a victim among the live nodes at every crash; rebuilding
the list of live nodes each time made a swarm of N nodes crashing at a fixed rate per node
cost O(N^2) per virtual minute. ``EligibleNodes`` is the same choice with a few indices left
out, as a sequence ``random.Random.choice`` takes: the same draw gives the same node as a
list of the eligible nodes would.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence


class LiveNodes:
    __slots__ = ("_tree", "_flags", "count")

    def __init__(self) -> None:
        self._tree = array("q", [0])  # 1-based: _tree[i] sums the flags of (i - lsb(i), i]
        self._flags = bytearray()
        self.count = 0

    def __len__(self) -> int:
        """Nodes known (up or down)."""
        return len(self._flags)

    def _prefix(self, i: int) -> int:
        """Up nodes among indices < i."""
        tree, total = self._tree, 0
        while i > 0:
            total += tree[i]
            i &= i - 1
        return total

    def add(self) -> None:
        """One more node, down."""
        i = len(self._tree)
        self._tree.append(self._prefix(i - 1) - self._prefix(i - (i & -i)))
        self._flags.append(0)

    def set(self, index: int, up: bool) -> None:
        if self._flags[index] == up:
            return
        self._flags[index] = up
        delta = 1 if up else -1
        self.count += delta
        tree, i = self._tree, index + 1
        while i < len(tree):
            tree[i] += delta
            i += i & -i

    def is_up(self, index: int) -> bool:
        return bool(self._flags[index])

    def nth(self, k: int) -> int:
        """The index of the k-th up node (0-based, in index order)."""
        if not 0 <= k < self.count:
            raise IndexError(f"{k} out of {self.count} live nodes")
        tree, n = self._tree, len(self._tree) - 1
        pos, rest = 0, k + 1
        step = 1 << (n.bit_length() - 1)
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] < rest:
                pos = nxt
                rest -= tree[nxt]
            step >>= 1
        return pos


class EligibleNodes(Sequence[int]):
    """The up nodes but ``excluded`` ones, in index order, as a read-only sequence."""

    def __init__(self, live: LiveNodes, excluded: frozenset[int]) -> None:
        self.live = live
        self.skip = sorted(i for i in excluded if i < len(live) and live.is_up(i))
        self._skip_set = frozenset(self.skip)

    def __len__(self) -> int:
        return self.live.count - len(self.skip)

    def __getitem__(self, k: int) -> int:  # type: ignore[override]
        if not 0 <= k < len(self):
            raise IndexError(k)
        t = k
        while True:  # the live rank t whose node is the k-th not skipped; t only grows
            pos = self.live.nth(t)
            before = bisect.bisect_right(self.skip, pos)
            if pos not in self._skip_set and t - before == k:
                return pos
            t = max(t + 1, k + before)
