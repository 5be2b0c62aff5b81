"""What drivers read of a requester machine that wraps an auction: the daemon's task service
and the simulator read these from ``Auction``'s wrappers (``VerifiedAuction``,
``PlanningRequester``) as from ``Auction`` itself, so each wrapper hands the same views through.
"""

from __future__ import annotations

from typing import Protocol

from protocol.market.progress import ProgressBook
from protocol.market.state import OpenTask


class _Auction(Protocol):
    @property
    def tasks(self) -> dict[bytes, OpenTask]: ...
    @property
    def counters(self) -> dict[str, int]: ...
    @property
    def progress(self) -> ProgressBook: ...
    def open_tasks(self) -> list[OpenTask]: ...


class AuctionViews:
    """The wrapped ``auction``'s tasks, counters, progress and open tasks."""

    auction: _Auction

    @property
    def tasks(self) -> dict[bytes, OpenTask]:
        return self.auction.tasks

    @property
    def counters(self) -> dict[str, int]:
        return self.auction.counters

    @property
    def progress(self) -> ProgressBook:
        return self.auction.progress

    def open_tasks(self) -> list[OpenTask]:
        return self.auction.open_tasks()
