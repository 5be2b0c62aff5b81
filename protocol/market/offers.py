"""What an executor serves and how well it fits a task's requirement.

``match_score`` is the one model-matching rule: an executor bids with it, and a requester
counts who could bid with it (protocol/market/bidders.py). ``best_offer`` is the bidder's
choice of agent: with agents, the one whose card fits the task's need best by
protocol.agents.wire.card_match (the requester's own rule, which it applies to the card its
ledger holds: a bidder gains nothing by claiming more), on a served model that fits the
requirement; for a task that names no need, the first of its agents, in the operator's order.
A node hosting several agents thus bids once per task, with one agent: the requester's
selectors key their arms by peer, and the peer's one bid per task keeps that key valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.agents.cards import AgentCard
from protocol.agents.wire import card_match, has_need
from protocol.market.messages import Requirement

MATCH_EXACT = 1.0
MATCH_FAMILY = 0.75
MATCH_ANY = 0.5


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    family: str
    context: int
    model_hash: bytes
    #: measured by the self-benchmark
    tokens_per_s: float
    price_per_1k: float
    #: weights format as the registry names it ("Q4_1", "F16", ...); "" = not known
    quantization: str = ""


def match_score(req: Requirement, model: ServedModel) -> float | None:
    """How well ``model`` fits ``req``, in [0, 1]; None when it does not fit at all."""
    if model.context < req.min_context:
        return None
    wanted_name, wanted_family = req.model.lower(), req.family.lower()
    if not wanted_name and not wanted_family:
        return MATCH_ANY
    if wanted_name and wanted_name == model.name.lower():
        return MATCH_EXACT
    if model.family.lower() in {wanted_family, wanted_name} - {""}:
        return MATCH_FAMILY
    return None


def best_model(req: Requirement,
               models: tuple[ServedModel, ...]) -> tuple[ServedModel, float] | None:
    """The model of ``models`` that fits ``req`` best (score, then speed, then name) and its
    score; None when none fits."""
    best: tuple[ServedModel, float] | None = None
    for m in models:
        score = match_score(req, m)
        if score is None:
            continue
        if best is None or (score, m.tokens_per_s, m.name) > (best[1], best[0].tokens_per_s,
                                                               best[0].name):
            best = (m, score)
    return best


@dataclass(frozen=True, slots=True)
class Offer:
    """What a bid offers: the model, the agent ("" for a node that hosts none) and the match."""

    model: ServedModel
    agent: str
    score: float


def best_offer(req: Requirement, models: tuple[ServedModel, ...],
               agents: tuple[AgentCard, ...]) -> Offer | None:
    """The bid for ``req`` (see the module docstring); None when nothing fits. Without agents,
    today's rule: the best model, and no task that names a need."""
    if not agents:
        if has_need(req):
            return None
        best = best_model(req, models)
        return None if best is None else Offer(best[0], "", best[1])
    chosen: Offer | None = None
    for card in agents:
        fits = models if card.model is None else tuple(m for m in models if m.name == card.model)
        best = best_model(req, fits)
        if best is None:
            continue
        score = card_match(card, req) if has_need(req) else best[1]
        if score is not None and (chosen is None or score > chosen.score):
            chosen = Offer(best[0], card.name, score)
    return chosen
