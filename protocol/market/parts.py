"""What the halves of the requester's ``Auction`` share: its state and the steps both call.

``protocol.market.bidding.Bidding`` (beacons and bids) and ``protocol.market.results.
ResultIntake`` (results and votes) are mixed into ``protocol.market.auction.Auction``, which
sets every attribute declared here and implements every step. Declaring them once here lets
each half type-check on its own without restating the other's interface.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.machine import Effect
from protocol.market.events import AuctionConfig, TaskUpdated
from protocol.market.selection import Selector
from protocol.market.state import Attempt, OpenTask


class AuctionParts:
    config: AuctionConfig
    selector: Selector
    reputation: Callable[[str], float]
    tasks: dict[bytes, OpenTask]

    def _count(self, what: str) -> None:
        raise NotImplementedError

    def _rejecter(self, scope: str, noun: str, peer: str) -> Callable[..., list[Effect]]:
        raise NotImplementedError

    def _updated(self, task: OpenTask) -> TaskUpdated:
        raise NotImplementedError

    def _replan(self, task: OpenTask, now: int, after_close: bool = False) -> list[Effect]:
        raise NotImplementedError

    def _fail_attempt(self, task: OpenTask, attempt: Attempt, reason: str, outcome: str | None,
                      now: int, cancel: bool = True) -> list[Effect]:
        raise NotImplementedError
