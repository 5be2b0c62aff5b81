"""The striped relay plan (SplitStream): the artifact split into stripes, one tree per stripe.

Contract
--------
``build_striped_plan`` turns the same inputs as ``protocol.relay.plan.build_plan`` plus a
stripe count ``s`` into ``s`` trees over the same nodes. Chunk ``i`` belongs to stripe
``i % s`` and travels down that stripe's tree. Pure and deterministic: every peer computes it
from the signed manifest alone, and the same inputs in any order give the same plan.

Why stripes. In a single tree every leaf (about half the nodes) uploads nothing and every
interior node splits its uplink between its children, so everyone receives at a fraction of
the link rate. With ``s`` stripes, each node is an interior node in at most one tree (its
*home* stripe) and a leaf in the others: every uplink works, and a node with upload ``u``
feeds ``u / r`` children at the stripe rate ``r``, so everyone can receive at ``s * r``.

How the trees are chosen.

* The receive rate ``R`` aims at the aggregate bound: the publisher can send each stripe
  once (``R <= root upload``) and the recipients upload what they receive
  (``N * R <= total upload``). The stripe rate is ``r = R / s``; if the trees do not fit at
  that rate it is lowered step by step until they do.
* A node's slot budget is ``floor(upload / r)`` (at most ``max_fanout`` in its home tree).
  Nodes whose budget is zero (slow links, or peers the publisher advertises at 1 B/s, such as
  detected free riders) are never interior: they are leaves in every tree.
* Nodes with slots are dealt to the stripes fastest first, each to the stripe with the fewest
  slots so far. Each tree places, breadth-first, its home nodes under the root and each
  other, then every other node as a leaf in the shallowest free slot. If a tree runs out of
  slots, nodes with budget left over from their home tree take the rest (one level deeper).

Fetching (protocol/relay/fetching.py) keeps one source per stripe: the stripe's parent, or
after a failure the next of that tree's ``sources_for`` (the re-attach rule of
protocol/relay/plan.py). ``s = 1`` is the single bandwidth-aware tree of ``build_plan``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from protocol.relay.plan import (
    DEFAULT_UPLOAD_BPS,
    MAX_FANOUT,
    RelayPlan,
    build_plan,
    placement_order,
)

#: stripes per version the daemon and the simulator use unless told otherwise
DEFAULT_STRIPES = 4
MAX_STRIPES = 16
#: each failed attempt lowers the stripe rate by this factor (as a fraction num/den)
_RATE_STEP = Fraction(15, 16)
_MAX_RATE_STEPS = 96


@dataclass(frozen=True, slots=True)
class StripedPlan:
    root: str
    #: one tree per stripe; chunk i travels down trees[i % len(trees)]
    trees: tuple[RelayPlan, ...]
    #: estimated time for every recipient to complete, in ms
    estimated_ms: int

    @property
    def stripes(self) -> int:
        return len(self.trees)

    def stripe_of(self, index: int) -> int:
        return index % len(self.trees)

    def __contains__(self, peer: object) -> bool:
        return peer in self.trees[0]

    @property
    def max_depth(self) -> int:
        return max(t.max_depth for t in self.trees)

    @property
    def max_fanout(self) -> int:
        return max(t.max_fanout for t in self.trees)

    @property
    def rate_bps(self) -> float:
        """The receive rate the plan aims at: the sum of the stripe rates."""
        return sum(t.rate_bps for t in self.trees)

    def parents_of(self, peer: str) -> tuple[str, ...]:
        """``peer``'s parent in each tree, without repeats, in stripe order."""
        out: dict[str, None] = {}
        for tree in self.trees:
            if peer in tree.parent:
                out[tree.parent[peer]] = None
        return tuple(out)

    def children_of(self, peer: str) -> tuple[str, ...]:
        """Every peer that pulls some stripe from ``peer``, without repeats, in stripe order."""
        out: dict[str, None] = {}
        for tree in self.trees:
            for child in tree.children.get(peer, ()):
                out[child] = None
        return tuple(out)

    def interior_stripes(self, peer: str) -> list[int]:
        """The stripes in which ``peer`` feeds someone."""
        return [k for k, tree in enumerate(self.trees) if tree.children.get(peer)]


def _stripe_rate(root_up: int, uploads: Sequence[int], stripes: int) -> Fraction:
    """The aggregate bound on the receive rate, divided among the stripes."""
    n = len(uploads) - 1
    aggregate = Fraction(sum(uploads), max(1, n))
    return min(Fraction(root_up), aggregate) / stripes


def _deal_homes(budgets: Sequence[int], stripes: int, max_fanout: int) -> list[list[int]]:
    """Node indices (1.., fastest first) dealt to home stripes, balancing the slots."""
    homes: list[list[int]] = [[] for _ in range(stripes)]
    slots = [0] * stripes
    for j in range(1, len(budgets)):
        if budgets[j] > 0:
            k = min(range(stripes), key=lambda s: (slots[s], s))
            homes[k].append(j)
            slots[k] += min(max_fanout, budgets[j])
    return homes


def _place_tree(
    n: int,
    root_slots: int,
    home: Sequence[int],
    home_slots: Sequence[int],
    spare_budget: list[int],
    max_fanout: int,
) -> list[int] | None:
    """Parent index of every node 1..n-1 in one stripe's tree (or None: not enough slots).

    Home nodes hold ``home_slots`` each; when those run out, nodes already placed that have
    ``spare_budget`` left (fastest first) take the rest, and this lowers their budget."""
    home_set = set(home)
    order = [*home, *(j for j in range(1, n) if j not in home_set)]
    parents = [-1] * n
    holders: list[list[int]] = [[0, root_slots]]  # [node, free slots], breadth-first
    head = 0
    placed: list[int] = []
    spare_at = 0
    for j in order:
        while head < len(holders) and holders[head][1] == 0:
            head += 1
        while head == len(holders) and spare_at < len(placed):
            node = placed[spare_at]
            spare_at += 1
            if node not in home_set and spare_budget[node] > 0:
                holders.append([node, min(max_fanout, spare_budget[node])])
        if head == len(holders):
            return None
        holder = holders[head]
        holder[1] -= 1
        if holder[0] != 0 and holder[0] not in home_set:
            spare_budget[holder[0]] -= 1
        parents[j] = holder[0]
        placed.append(j)
        if j in home_set:
            holders.append([j, home_slots[j]])
    return parents


def _try_rate(
    uploads: Sequence[int], rate: Fraction, stripes: int, max_fanout: int
) -> list[list[int]] | None:
    """Every tree's parent indices at stripe rate ``rate``, or None if they do not fit."""
    n = len(uploads)
    budgets = [int(u / rate) for u in uploads]
    root_slots = min(max_fanout, budgets[0] // stripes)
    if root_slots < 1:
        return None
    homes = _deal_homes(budgets, stripes, max_fanout)
    home_slots = [min(max_fanout, b) for b in budgets]
    spare_budget = [b - h for b, h in zip(budgets, home_slots, strict=True)]
    trees: list[list[int]] = []
    for k in range(stripes):
        parents = _place_tree(n, root_slots, homes[k], home_slots, spare_budget, max_fanout)
        if parents is None:
            return None
        trees.append(parents)
    return trees


def _as_plan(
    order: Sequence[str], parents: Sequence[int], rate: Fraction, stripe_size: int,
    chunk_size: int,
) -> RelayPlan:
    """One stripe's tree as a RelayPlan; pipelined, each hop adds one chunk time."""
    n = len(order)
    depths = [0] * n
    children: dict[str, list[str]] = {p: [] for p in order}
    parent: dict[str, str] = {}
    for j in _parents_first(parents):
        depths[j] = depths[parents[j]] + 1
        parent[order[j]] = order[parents[j]]
        children[order[parents[j]]].append(order[j])
    work = stripe_size + max(depths) * chunk_size
    return RelayPlan(
        root=order[0],
        rate_num=rate.numerator,
        rate_den=rate.denominator,
        order=tuple(order),
        parent=parent,
        children={p: tuple(c) for p, c in children.items()},
        depth={p: depths[j] for j, p in enumerate(order)},
        estimated_ms=int(work * 1000 / rate),
    )


def _parents_first(parents: Sequence[int]) -> list[int]:
    """Node indices 1.. in an order where every parent comes before its children."""
    kids: dict[int, list[int]] = {}
    for j in range(1, len(parents)):
        kids.setdefault(parents[j], []).append(j)
    out: list[int] = []
    stack = [0]
    while stack:
        for child in reversed(kids.get(stack.pop(), [])):
            out.append(child)
            stack.append(child)
    return out


def build_striped_plan(
    root: str,
    root_upload_bps: int,
    recipients: Iterable[tuple[str, int]],
    *,
    total_size: int,
    chunk_size: int,
    seed: bytes,
    stripes: int = DEFAULT_STRIPES,
    max_fanout: int = MAX_FANOUT,
) -> StripedPlan:
    """The striped relay plan for one version; see the module docstring."""
    if not 1 <= stripes <= MAX_STRIPES:
        raise ValueError(f"stripes must be within 1..{MAX_STRIPES}, got {stripes}")
    if max_fanout < 1 or total_size < 1 or chunk_size < 1:
        raise ValueError("max_fanout, total_size and chunk_size must be positive")
    recipients = list(recipients)
    root_up = root_upload_bps if root_upload_bps > 0 else DEFAULT_UPLOAD_BPS
    order, uploads = placement_order(root, root_up, recipients, seed)
    trees: list[list[int]] | None = None
    if stripes > 1 and len(order) > stripes:
        rate = _stripe_rate(root_up, uploads, stripes)
        for _ in range(_MAX_RATE_STEPS):
            trees = _try_rate(uploads, rate, stripes, max_fanout)
            if trees is not None:
                break
            rate *= _RATE_STEP
    if trees is None:  # one stripe, too few peers, or no striping fits: the single tree
        tree = build_plan(
            root, root_upload_bps, recipients, total_size=total_size,
            chunk_size=chunk_size, seed=seed, max_fanout=max_fanout,
        )
        return StripedPlan(root=root, trees=(tree,), estimated_ms=tree.estimated_ms)
    stripe_size = -(-total_size // stripes)
    plans = tuple(_as_plan(order, p, rate, stripe_size, chunk_size) for p in trees)
    return StripedPlan(root=root, trees=plans, estimated_ms=max(p.estimated_ms for p in plans))
