"""The relay plan: who pulls each artifact version from whom. Pure and deterministic.

Contract
--------
``build_plan`` turns the publisher (the root), its upload bandwidth, the recipients with theirs,
the artifact size, the chunk size and a seed (the manifest id), held in a ``PlanInputs``, into a tree: every recipient has
exactly one parent and at most ``max_fanout`` children. Every peer computes it from the signed
manifest alone, so all peers agree on it; the same inputs in any order give the same plan.

How the tree is chosen. Every recipient should receive at one common rate ``r`` bytes/s. A node
with upload ``u`` can feed ``floor(u / r)`` children at that rate (capped at ``max_fanout``).
Peers are placed breadth-first, fastest uploaders first (ties broken by a hash of the seed and
the peer id, so the deep positions rotate between versions), each under the earliest node that
still has a free slot. Pipelined, each hop adds one chunk time, so the whole relay takes about

    (total_size + depth * chunk_size) / r

The rates tried are ``u / k`` for every distinct upload ``u`` and ``k`` in ``1..max_fanout``,
no faster than the root's upload; the plan is the feasible one (every peer placed) with the
smallest estimate, compared exactly in integers. Equal bandwidths and a file much larger than a
chunk give a chain; many peers or a fast root give a tree.

Re-attach rule (``sources_for``): when a peer's parent fails, it pulls the missing chunks from
another holder: its nearest live ancestor first (an ancestor is always at least as far along),
then any other live plan node outside its own subtree (whose nodes pull through it), in plan
order. A peer outside the plan (a late fetcher) takes plan nodes deepest first (leaves have
spare upload), the root last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from fractions import Fraction

from crypto.hashing import digest

#: most children one node feeds; beyond this, per-child overhead outweighs a shallower tree
MAX_FANOUT = 8
#: upload bandwidth assumed for a publisher that advertises none (bytes/s); a recipient that
#: advertises none is assumed to have the publisher's (symmetric links)
DEFAULT_UPLOAD_BPS = 100 * 1024 * 1024
_TIE_PERSON = b"symphony-relay"


@dataclass(frozen=True, slots=True)
class RelayPlan:
    root: str
    #: the common receive rate, as the fraction rate_num / rate_den bytes per second
    rate_num: int
    rate_den: int
    #: breadth-first order, root first
    order: tuple[str, ...]
    parent: Mapping[str, str]
    children: Mapping[str, tuple[str, ...]]
    depth: Mapping[str, int]
    #: estimated time for every recipient to complete, in ms, at ``rate``
    estimated_ms: int
    #: how many hops below each node its deepest descendant is (0: a leaf); a parent serves
    #: a chunk to its children tallest first, so the longest path waits least
    height: Mapping[str, int]

    @property
    def rate_bps(self) -> float:
        return self.rate_num / self.rate_den

    @property
    def max_depth(self) -> int:
        return max(self.depth.values())

    @property
    def max_fanout(self) -> int:
        return max((len(c) for c in self.children.values()), default=0)

    def __contains__(self, peer: object) -> bool:
        return peer in self.depth

    def ancestors(self, peer: str) -> list[str]:
        """Parent, grandparent, ..., root."""
        out: list[str] = []
        while peer in self.parent:
            peer = self.parent[peer]
            out.append(peer)
        return out

    def subtree(self, peer: str) -> set[str]:
        """``peer`` and everyone below it."""
        out = {peer}
        stack = [peer]
        while stack:
            for child in self.children.get(stack.pop(), ()):
                out.add(child)
                stack.append(child)
        return out

    def sources_for(self, peer: str, failed: Set[str] = frozenset()) -> list[str]:
        """Where ``peer`` pulls from, best first, skipping ``failed`` (the re-attach rule)."""
        if peer == self.root:
            return []
        if peer not in self.depth:
            ranked = sorted(enumerate(self.order), key=lambda ip: (-self.depth[ip[1]], ip[0]))
            return [p for _, p in ranked if p not in failed]
        ancestors = self.ancestors(peer)
        below = self.subtree(peer)
        seen = set(ancestors)
        others = [p for p in self.order if p not in below and p not in seen]
        return [p for p in ancestors + others if p not in failed]


def tree_heights(top_down: Sequence[str], parent: Mapping[str, str]) -> dict[str, int]:
    """Each node's height (see ``RelayPlan.height``); ``top_down`` lists every node after
    its parent."""
    height = dict.fromkeys(top_down, 0)
    for peer in reversed(top_down):
        up = parent.get(peer)
        if up is not None and height[up] <= height[peer]:
            height[up] = height[peer] + 1
    return height


def _tiebreak(seed: bytes, peer: str) -> bytes:
    return digest(seed + peer.encode("utf-8"), person=_TIE_PERSON)


def place_at_rate(uploads: Sequence[int], num: int, den: int,
                  max_fanout: int) -> list[int] | None:
    """Parent index of each node 1.. (0 is the root) at rate num/den, or None if infeasible.

    ``uploads`` are in placement order (root first). Node ``j`` goes under the earliest node
    with a free slot; a node can only parent nodes placed after it.
    """
    parents = [-1]
    holder, free = 0, min(max_fanout, uploads[0] * den // num)
    for j in range(1, len(uploads)):
        while free == 0:
            holder += 1
            if holder >= j:
                return None
            free = min(max_fanout, uploads[holder] * den // num)
        parents.append(holder)
        free -= 1
    return parents


#: a placed tree at one rate: (its depth, the parent index of each node, the depth of each)
_Placement = tuple[int, list[int], list[int]]


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """What a relay plan is a function of (the planners of this module and of striping.py
    take it whole): the publisher (the root) and its upload, the recipients with theirs, the
    artifact's sizes, the seed (the manifest id) and the most children one node feeds.
    Hashable, so a memo of a planner keys on it."""

    root: str
    #: 0: none advertised (DEFAULT_UPLOAD_BPS is assumed)
    root_upload_bps: int
    #: (peer, upload bps); an upload of 0 or less: links like the publisher's
    recipients: tuple[tuple[str, int], ...]
    total_size: int
    chunk_size: int
    seed: bytes
    max_fanout: int = MAX_FANOUT

    def __post_init__(self) -> None:
        if self.max_fanout < 1 or self.total_size < 1 or self.chunk_size < 1:
            raise ValueError("max_fanout, total_size and chunk_size must be positive")

    def placement(self) -> tuple[list[str], list[int]]:
        """:func:`placement_order` of these inputs (the root's upload defaulted)."""
        root_up = self.root_upload_bps if self.root_upload_bps > 0 else DEFAULT_UPLOAD_BPS
        return placement_order(self.root, root_up, self.recipients, self.seed)


def placement_order(
    root: str, root_up: int, recipients: Iterable[tuple[str, int]], seed: bytes
) -> tuple[list[str], list[int]]:
    """The nodes in placement order, root first, and their uploads (the best one a recipient
    listed; unknown: links like the publisher's)."""
    best_upload: dict[str, int] = {}
    for peer, upload in recipients:
        if peer != root:
            up = upload if upload > 0 else root_up
            best_upload[peer] = max(up, best_upload.get(peer, 0))
    peers = sorted(best_upload, key=lambda p: (-best_upload[p], _tiebreak(seed, p), p))
    return [root, *peers], [root_up, *(best_upload[p] for p in peers)]


def _candidate_rates(uploads: Sequence[int], max_fanout: int) -> list[Fraction]:
    """Every distinct upload / 1..max_fanout, no faster than the root's upload, fastest first."""
    all_rates = {Fraction(u, k) for u in set(uploads) for k in range(1, max_fanout + 1)}
    return sorted((r for r in all_rates if r <= uploads[0]), reverse=True)


def _placements(
    uploads: Sequence[int], rates: Sequence[Fraction], max_fanout: int
) -> dict[int, _Placement | None]:
    """The tree placed at the rates that can be best (by index into ``rates``; None:
    infeasible). Slower rates give every node more slots, so depth falls monotonically along
    ``rates``: bisect for where it changes and keep, per depth, its fastest rate (the only one
    that can be best), instead of placing the tree at every rate."""
    evaluated: dict[int, _Placement | None] = {}
    n = len(uploads)

    def depth_at(i: int) -> int:
        if i not in evaluated:
            rate = rates[i]
            parents = place_at_rate(uploads, rate.numerator, rate.denominator, max_fanout)
            if parents is None:
                evaluated[i] = None
            else:
                depths = [0] * n
                for j in range(1, n):
                    depths[j] = depths[parents[j]] + 1
                evaluated[i] = (max(depths), parents, depths)
        result = evaluated[i]
        return n + 1 if result is None else result[0]

    def scan(lo: int, hi: int) -> None:
        if hi - lo <= 1 or depth_at(lo) == depth_at(hi):
            return  # no depth change strictly inside: lo is the fastest rate of its depth
        mid = (lo + hi) // 2
        depth_at(mid)
        scan(lo, mid)
        scan(mid, hi)

    depth_at(0)
    depth_at(len(rates) - 1)
    scan(0, len(rates) - 1)
    return evaluated


def _fastest(
    evaluated: dict[int, _Placement | None],
    rates: Sequence[Fraction],
    total_size: int,
    chunk_size: int,
) -> tuple[Fraction, int, list[int], list[int]]:
    """(rate, work in bytes, parents, depths) of the placement with the smallest estimate."""
    best: tuple[Fraction, int, list[int], list[int]] | None = None
    for i in sorted(evaluated):
        result = evaluated[i]
        if result is None:
            continue
        work = total_size + result[0] * chunk_size  # bytes-equivalent; time = work / rate
        if best is None or Fraction(work) / rates[i] < Fraction(best[1]) / best[0]:
            best = (rates[i], work, result[1], result[2])
    if best is None:  # unreachable: rate = min(uploads) gives every node a slot
        raise ValueError("no feasible relay plan")
    return best


def build_plan(inputs: PlanInputs) -> RelayPlan:
    """The relay tree for one version; see the module docstring."""
    order, uploads = inputs.placement()
    rates = _candidate_rates(uploads, inputs.max_fanout)
    evaluated = _placements(uploads, rates, inputs.max_fanout)
    rate, work, parents, depths = _fastest(evaluated, rates, inputs.total_size, inputs.chunk_size)
    num, den = rate.numerator, rate.denominator
    children: dict[str, list[str]] = {p: [] for p in order}
    parent: dict[str, str] = {}
    for j in range(1, len(order)):
        parent[order[j]] = order[parents[j]]
        children[order[parents[j]]].append(order[j])
    return RelayPlan(
        root=inputs.root,
        rate_num=num,
        rate_den=den,
        order=tuple(order),
        parent=parent,
        children={p: tuple(c) for p, c in children.items()},
        depth={p: depths[j] for j, p in enumerate(order)},
        estimated_ms=work * den * 1000 // num,
        height=tree_heights(order, parent),
    )
