"""What an executor serves and how well it fits a task's requirement.

``match_score`` is the one matching rule: an executor bids with it, and a requester counts
who could bid with it (protocol/market/bidders.py).
"""

from __future__ import annotations

from dataclasses import dataclass

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
