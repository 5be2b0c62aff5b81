"""The striped relay plan (SplitStream): the artifact split into stripes, one tree per stripe.

Contract
--------
``build_striped_plan`` turns the same ``PlanInputs`` as ``protocol.relay.plan.build_plan`` plus a
most-stripes count ``stripes`` into ``s`` trees over the same nodes, ``s`` being the count
in ``2..stripes`` with the smallest estimated time (or the single tree, ``s = 1``, when that
estimates faster or nothing else fits). Chunk ``i`` belongs to stripe ``i % s`` and travels
down that stripe's tree. Pure and deterministic: every peer computes it from the signed
manifest alone, and the same inputs in any order give the same plan.

Why stripes. In a single tree every leaf (about half the nodes) uploads nothing and every
interior node splits its uplink between its children, so everyone receives at a fraction of
the link rate. With ``s`` stripes, each node is an interior node in at most one tree (its
*home* stripe) and a leaf in the others: every uplink works, and a node with upload ``u``
feeds ``u / r`` children at the stripe rate ``r``, so everyone can receive at ``s * r``.

How the trees are chosen.

* The receive rate ``R`` aims at the aggregate bound: the publisher can send each stripe
  once (``R <= root upload``) and the recipients upload what they receive
  (``N * R <= total upload``). The stripe rate is ``r = R / s``; if the trees do not fit at
  that rate it is lowered to the next rate at which some node gains a slot, until they do.
* A node's slot budget is ``floor(upload / r)`` (at most ``max_fanout`` in its home tree).
  Nodes whose budget is zero (slow links, or peers the publisher advertises at 1 B/s, such as
  detected free riders) are never interior: they are leaves in every tree. Slots are whole,
  so the stripe count matters: with 10% free riders every honest node must feed 1/0.9 of a
  node's worth, which 4 stripes can only give as 5 slots of R/4 (R = 0.8 of the link), and 7
  stripes as 8 slots of R/7 (R = 0.875). More stripes cost more per hop (a chunk of a stripe
  arrives at the stripe rate), which the estimate ``(S / s + depth * chunk) / r`` weighs.
* Nodes with slots are dealt to the stripes fastest first, each to the stripe with the fewest
  slots so far. Each tree places, breadth-first, its home nodes under the root and each
  other; then one leaf under every home node (so every node feeds someone somewhere, and a
  free rider is seen by a child), then every other node as a leaf in the shallowest free
  slot. If a tree runs out of slots, nodes with budget left over from their home tree take
  the rest (one level deeper).
* Each tree keeps every node's height (``RelayPlan.height``): a parent serves a chunk to the
  children waiting for it tallest first (``serve_order``), so the longest path waits least.

Fetching (protocol/relay/fetching.py) keeps one source per stripe: the stripe's parent, or
after a failure the next of that tree's ``sources_for`` (the re-attach rule of
protocol/relay/plan.py). ``s = 1`` is the single bandwidth-aware tree of ``build_plan``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from protocol.relay.manifest import Manifest
from protocol.relay.plan import PlanInputs, RelayPlan, build_plan, tree_heights

#: most stripes per version the daemon and the simulator allow the plan unless told otherwise
DEFAULT_STRIPES = 8
MAX_STRIPES = 16
#: stripe rates tried per stripe count (each the next at which some node gains a slot)
_MAX_RATE_STEPS = 384


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

    def serve_order(self, index: int, peers: Sequence[str]) -> list[str]:
        """``peers`` waiting for chunk ``index``, tallest in its stripe's tree first (a peer
        outside the plan last), else in the order they asked."""
        height = self.trees[index % len(self.trees)].height
        return sorted(peers, key=lambda p: -height.get(p, -1))

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
    ``spare_budget`` left (fastest first) take the rest, and this lowers their budget. Every
    home node gets a leaf first, while there are leaves for all: a node interior nowhere
    would upload nothing, so a free rider there would go unnoticed by children's reports."""
    home_set = set(home)
    leaves = [j for j in range(1, n) if j not in home_set]
    parents = [-1] * n
    holders: list[list[int]] = [[0, root_slots]]  # [node, free slots], breadth-first
    head = 0
    placed: list[int] = []
    spare_at = 0
    order = list(home)
    order.append(-1)  # marks the end of the home nodes
    order.extend(leaves)
    for j in order:
        if j == -1:
            _first_leaves(holders, home_set, home_slots, leaves, parents, placed)
            continue
        if parents[j] != -1:
            continue
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


def _first_leaves(
    holders: list[list[int]], home_set: set[int], home_slots: Sequence[int],
    leaves: Sequence[int], parents: list[int], placed: list[int],
) -> None:
    """One leaf under each home node still without a child, if the leaves suffice for all."""
    childless = [h for h in holders if h[0] in home_set and 0 < h[1] == home_slots[h[0]]]
    if len(childless) > len(leaves):
        return
    for holder, leaf in zip(childless, leaves, strict=False):
        holder[1] -= 1
        parents[leaf] = holder[0]
        placed.append(leaf)


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
    top_down = _parents_first(parents)
    for j in top_down:
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
        height=tree_heights([order[0], *(order[j] for j in top_down)], parent),
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


def build_striped_plan(inputs: PlanInputs, stripes: int = DEFAULT_STRIPES) -> StripedPlan:
    """The striped relay plan for one version; see the module docstring. Pure: a function of
    its arguments, whose result is only read (a driver may share it through a
    ``protocol.machine.Memo``)."""
    if not 1 <= stripes <= MAX_STRIPES:
        raise ValueError(f"stripes must be within 1..{MAX_STRIPES}, got {stripes}")
    order, uploads = inputs.placement()
    tree = build_plan(inputs)
    total_size, chunk_size, max_fanout = inputs.total_size, inputs.chunk_size, inputs.max_fanout
    best: tuple[Fraction, Fraction, list[list[int]]] | None = None
    for count in range(2, min(stripes, len(order) - 1) + 1):
        found = _striped(uploads, count, total_size, chunk_size, max_fanout)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    if best is None or best[0] * 1000 >= tree.estimated_ms:
        return StripedPlan(root=inputs.root, trees=(tree,), estimated_ms=tree.estimated_ms)
    _, rate, trees = best
    stripe_size = -(-total_size // len(trees))
    plans = tuple(_as_plan(order, p, rate, stripe_size, chunk_size) for p in trees)
    return StripedPlan(root=inputs.root, trees=plans,
                       estimated_ms=max(p.estimated_ms for p in plans))


def _striped(
    uploads: Sequence[int], stripes: int, total_size: int, chunk_size: int, max_fanout: int
) -> tuple[Fraction, Fraction, list[list[int]]] | None:
    """(estimated seconds, stripe rate, each tree's parent indices) of the plan with exactly
    ``stripes`` trees at the fastest stripe rate that fits, or None if none does."""
    rate = _stripe_rate(uploads[0], uploads, stripes)
    distinct = sorted(set(uploads))
    for _ in range(_MAX_RATE_STEPS):
        trees = _try_rate(uploads, rate, stripes, max_fanout)
        if trees is not None:
            depth = max(_max_depth(parents) for parents in trees)
            work = -(-total_size // stripes) + depth * chunk_size
            return work / rate, rate, trees
        rate = _next_rate(distinct, rate)
    return None


def _max_depth(parents: Sequence[int]) -> int:
    depths = [0] * len(parents)
    for j in _parents_first(parents):
        depths[j] = depths[parents[j]] + 1
    return max(depths)


def manifest_plan(manifest: Manifest, *, stripes: int, max_fanout: int,
                  build: Callable[..., StripedPlan] = build_striped_plan) -> StripedPlan:
    """The striped plan a version's manifest yields: its signer the root, its recipients and
    sizes, its id the seed. ``build`` is ``build_striped_plan`` or a memo of it (both of its
    arguments are hashable)."""
    body = manifest.body
    inputs = PlanInputs(
        root=manifest.signer,
        root_upload_bps=body.publisher_upload_bps,
        recipients=tuple((r.peer_id, r.upload_bps) for r in body.recipients),
        total_size=body.total_size,
        chunk_size=body.chunk_size,
        seed=manifest.id,
        max_fanout=max_fanout,
    )
    return build(inputs, stripes)


def _next_rate(distinct: Sequence[int], rate: Fraction) -> Fraction:
    """The fastest stripe rate below ``rate`` at which some node gains a slot (a budget is
    ``floor(upload / rate)``, so nothing changes in between)."""
    return max(Fraction(u, int(u / rate) + 1) for u in distinct)
