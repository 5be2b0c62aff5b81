"""Who may verify a result and who is excluded from work: read from the ledger, one rule for all.

A ``VerifiedAuction`` asks two questions its driver answers from the node's ledger:

* which peers are verifier candidates for a result of model hash ``h``: the live peers whose
  capability record carries the verifier role and a model offer whose weights hash is ``h``
  (:meth:`LedgerCandidates.verifiers`), in the ledger view's order (best reputation first);
  the requester ranks them by the unsteerable seed afterwards, so this order decides nothing;
* whether a bidder is excluded network-wide: the ledger shows it convicted by others within
  the exclusion window (``protocol.verification.rules.ledger_convicted``;
  :meth:`LedgerCandidates.excluded`).

Without a ledger (``view_of`` returns None) there are no candidates and nobody is excluded.
:func:`verified_auction` builds the requester's machine with both answers wired and every
auction option (``possible_bidders`` among them) passed in one ``AuctionOptions`` record, so the daemon
(node/verification/service.py) and the simulator (simulations/machines/verification.py) build
it the same way and neither can leave one out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from random import Random

from crypto.keys import Identity
from protocol.ledger.records import Role
from protocol.ledger.view import LedgerView
from protocol.market.events import AuctionConfig
from protocol.market.options import AuctionOptions
from protocol.market.selection import Selector
from protocol.verification.requester import VerifiedAuction
from protocol.verification.rules import ledger_convicted
from protocol.verification.state import VerifyConfig

ViewOf = Callable[[], LedgerView | None]


class LedgerCandidates:
    """The ``verifier_candidates`` and ``excluded`` callbacks of a ``VerifiedAuction``."""

    def __init__(self, view_of: ViewOf, exclusion_ms: int) -> None:
        self.view_of = view_of
        self.exclusion_ms = exclusion_ms

    def verifiers(self, model_hash: bytes, now: int) -> list[str]:
        """Live peers with the verifier role and a model of weights ``model_hash``."""
        view = self.view_of()
        if view is None:
            return []
        return [m.peer_id for m in view.find_peers(now, role=Role.VERIFIER)
                if any(o.weights_hash == model_hash for o in m.record.models)]

    def excluded(self, peer: str, now: int) -> bool:
        """Does the ledger show ``peer`` convicted by others within the exclusion window?"""
        view = self.view_of()
        return view is not None and ledger_convicted(view, peer, now, self.exclusion_ms)


def verified_auction(identity: Identity, selector: Selector, rng: Random,
                     config: AuctionConfig, options: AuctionOptions,
                     verify: VerifyConfig, view_of: ViewOf) -> VerifiedAuction:
    """A requester that verifies, its candidates and exclusions read from ``view_of()`` (the
    ledger's exclusions take the place of ``options.excluded``); the auction's options as
    ``protocol.market.auction.Auction`` takes them."""
    ledger = LedgerCandidates(view_of, verify.exclusion_ms)
    return VerifiedAuction(identity, selector, rng, config,
                           replace(options, excluded=ledger.excluded),
                           verify=verify, verifier_candidates=ledger.verifiers)
