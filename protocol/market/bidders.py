"""How many peers could bid on a task: the auction's ``possible_bidders``, from a ledger view.

The requester's bid window closes early once every one of them has bid
(protocol/market/bidding.py). A peer counts when its live capability record names the
executor role and offers a model that fits the task's requirement by the executors' own rule
(``protocol.market.executor.match_score``); the requester itself counts only when the task
allows it. A peer the ledger does not know yet may still bid: the count is a floor on who
could answer, and the window's other closing rules still apply.
"""

from __future__ import annotations

from protocol.ledger.records import ModelOffer, Role
from protocol.ledger.view import LedgerView
from protocol.market.executor import ServedModel, match_score
from protocol.market.messages import Requirement
from protocol.market.state import OpenTask


def offer_fits(req: Requirement, offer: ModelOffer) -> bool:
    served = ServedModel(name=offer.name, family=offer.family, context=offer.context_length,
                         model_hash=b"", tokens_per_s=offer.tokens_per_s, price_per_1k=0.0)
    return match_score(req, served) is not None


def possible_bidders(view: LedgerView, task: OpenTask, now: int) -> int:
    req = task.spec.requirement
    return sum(
        1 for match in view.find_peers(now, role=Role.EXECUTOR, include_self=task.allow_self)
        if any(offer_fits(req, offer) for offer in match.record.models)
    )
