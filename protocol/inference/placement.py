"""Where a request for a model runs: the task market, a chain of block servers, or nowhere.

Contract
--------
* :func:`place` decides for one request naming ``model`` ("" = any model) and ``family``:

  - :attr:`Route.MARKET` when some executor serves the model whole (a live ledger record's
    ``models``, or this node's own executor): the auction picks executors as ever. A request
    for any model, or for a family, goes to the market too unless only a chain can serve it.
  - :attr:`Route.CHAIN` when no one serves it whole but the live block offers (this node's
    own included) cover every one of its blocks, and this node can drive a chain of it (it holds the
    model's embedding and output head: ``chain_models``). A request for any model goes to a
    chain only when no model at all is served whole.
  - :attr:`Route.NOT_FOUND` otherwise, with a reason naming what is missing: nobody serves
    it; its blocks are offered but block ``b`` by nobody; or they are all covered but this
    node holds no head to drive a chain with.

* :func:`chain_coverage` is what the decision reads of the block offers: per model, the
  first block no live offer covers (``n_blocks`` when all are). Our own offers count: a node
  that serves blocks is a hop of its own chains (node/inference/local.py), as
  protocol.inference.routing.plan_chain is given them.
* :func:`servable` lists the models :func:`place` would not refuse, with when the oldest live
  record offering each (whole or in parts) was issued: what ``GET /v1/models`` shows.

Pure: the ledger view, ``now`` and this node's own offers come in as arguments.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from protocol.ledger.view import LedgerView


class Route(enum.Enum):
    MARKET = "market"
    CHAIN = "chain"
    NOT_FOUND = "not_found"


@dataclass(frozen=True, slots=True)
class Placement:
    route: Route
    #: the model to run ("" = any, left to the market)
    model: str
    #: why, in words (for NOT_FOUND, the error a client sees)
    reason: str


def whole_models(view: LedgerView, now: int, own_models: Collection[str] = ()) -> set[str]:
    """Models some live peer (or this node's executor) serves whole."""
    names = set(own_models)
    for match in view.find_peers(now):
        names.update(offer.name for offer in match.record.models)
    return names


def chain_coverage(view: LedgerView, now: int) -> dict[str, tuple[int, int]]:
    """Per model offered in blocks by live peers (this node included): (first uncovered
    block, n_blocks)."""
    spans: dict[str, tuple[int, list[tuple[int, int]]]] = {}
    for match in view.find_peers(now, include_self=True):
        for b in match.record.blocks:
            n, ranges = spans.setdefault(b.model, (b.n_blocks, []))
            if b.n_blocks == n:  # an offer that disagrees on the block count is ignored
                ranges.append((b.start, b.end))
    out = {}
    for model, (n, ranges) in spans.items():
        reached = 0
        for start, end in sorted(ranges):
            if start > reached:
                break
            reached = max(reached, end)
        out[model] = (min(reached, n), n)
    return out


def _covered(coverage: dict[str, tuple[int, int]]) -> set[str]:
    return {m for m, (reached, n) in coverage.items() if reached >= n}


def place(view: LedgerView, now: int, model: str, *, family: str = "",
          own_models: Collection[str] = (), chain_models: Collection[str] = ()) -> Placement:
    """Where a request for ``model`` ("" = any) of ``family`` runs (see the module contract)."""
    whole = whole_models(view, now, own_models)
    coverage = chain_coverage(view, now)
    chains = sorted(_covered(coverage) & set(chain_models))
    if not model:
        if whole or family or not chains:
            return Placement(Route.MARKET, "", "the market picks among the models served whole")
        return Placement(Route.CHAIN, chains[0], f"no model is served whole; {chains[0]} is "
                         "served in parts that cover all its blocks")
    if model in whole:
        return Placement(Route.MARKET, model, f"{model} is served whole")
    if model not in coverage:
        return Placement(Route.NOT_FOUND, model,
                         f"The model `{model}` does not exist or no peer serves it")
    reached, n = coverage[model]
    if reached < n:
        return Placement(Route.NOT_FOUND, model,
                         f"The model `{model}` is served only in parts, and no peer serves "
                         f"its block {reached} (of {n})")
    if model not in chain_models:
        return Placement(Route.NOT_FOUND, model,
                         f"The model `{model}` is served only in parts, and this node cannot "
                         "drive a chain of it: it holds no copy of its embedding and output "
                         "head (its [inference] model is another)")
    return Placement(Route.CHAIN, model, f"{model} is served only in parts, which cover all "
                     f"{n} of its blocks")


def servable(view: LedgerView, now: int, *, own_models: Mapping[str, int] | None = None,
             chain_models: Collection[str] = ()) -> dict[str, int]:
    """Each model a request may name -> when (Unix ms) it was first offered: the issue time of
    the oldest live record offering it, whole or in blocks, or for this node's own executor's
    models the time ``own_models`` gives, whichever is older."""
    out: dict[str, int] = dict(own_models or {})
    chains = _covered(chain_coverage(view, now)) & set(chain_models)
    for match in view.find_peers(now):
        rec = match.record
        names = {o.name for o in rec.models}
        names.update(b.model for b in rec.blocks if b.model in chains)
        for name in names:
            out[name] = min(out.get(name, rec.issued_at_ms), rec.issued_at_ms)
    return out
