"""What the halves of the requester's ``Auction`` share: its state and the steps both call.

``protocol.market.bidding.Bidding`` (beacons and bids) and ``protocol.market.results.
ResultIntake`` (results and votes) are mixed into ``protocol.market.auction.Auction``, which
sets every attribute declared here and implements every step. Declaring them once here lets
each half type-check on its own without restating the other's interface.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.envelopes import PENALTY_FORGED
from protocol.machine import Effect
from protocol.market.events import AuctionConfig, TaskUpdated
from protocol.market.selection import Selector
from protocol.market.state import Attempt, OpenTask


class AuctionParts:
    config: AuctionConfig
    selector: Selector
    reputation: Callable[[str], float]
    #: how many peers could bid on a task (the ledger's live peers serving a matching model,
    #: the requester itself only when the task allows it); None: not known
    possible_bidders: Callable[[OpenTask], int | None]
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

    def _assigned(self, peer: str, task_id: bytes, number: int,
                  reject: Callable[..., list[Effect]]) -> tuple[OpenTask, Attempt] | list[Effect]:
        """The open task and its attempt ``number`` when that attempt was assigned to ``peer``;
        else the rejection's effects (an attempt of someone else's is a forgery)."""
        task = self.tasks.get(task_id)
        if task is None:
            return reject("unknown_task")
        attempt = task.attempts.get(number)
        if attempt is None or attempt.peer != peer:
            return reject("not_assigned", PENALTY_FORGED)
        return task, attempt
