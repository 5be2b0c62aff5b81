"""A requester that answers in plan mode too: the task market's auction and the plan pipeline
as one machine (``handle(event, now) -> effects``, ``next_deadline()``).

Contract
--------
* ``SubmitPlanTask`` and ``ChildFinished`` go to the pipeline (protocol/agents/pipeline.py),
  every other event to the auction (``Auction`` or ``VerifiedAuction``); a ``Tick`` to both.
* The auction's final ``TaskUpdated`` of a pipeline's child becomes the pipeline's
  ``ChildFinished`` here, at once (the snapshot still goes out, so the driver stores the child
  like any task). The pipeline's ``Reward`` and ``CancelTask`` go straight to the auction.
* The pipeline's ``SubmitTask`` goes *out*, for the driver to hand back through ``handle``
  once it has done what a submit needs done outside the protocol (the daemon embeds the
  step's need text, as it does for an ask). A child the auction refuses (our own misuse, a
  ``LocalProtocolError``) ends there as a failed child, so its plan goes on. So one machine,
  one copy of the rules, for the daemon (node/market/requester.py) and the simulator.
"""

from __future__ import annotations

from protocol.agents.pipeline import PlanPipeline
from protocol.agents.plan_runs import ChildFinished, SubmitPlanTask, child_finished
from protocol.errors import LocalProtocolError
from protocol.machine import Effect, Tick
from protocol.market.auction import Auction, CancelTask, Reward, SubmitTask, TaskUpdated
from protocol.market.views import AuctionViews
from protocol.verification.requester import VerifiedAuction

#: rounds of routing between the two machines one event may cause (a child's end starts the
#: next step's submit, which leaves the machine: the chain is short; this bounds a bug)
MAX_ROUTING = 64


class PlanningRequester(AuctionViews):
    auction: Auction | VerifiedAuction

    def __init__(self, auction: Auction | VerifiedAuction, pipeline: PlanPipeline) -> None:
        self.auction = auction
        self.pipeline = pipeline

    def handle(self, event: object, now: int) -> list[Effect]:
        if isinstance(event, (SubmitPlanTask, ChildFinished)):
            return self._route(self.pipeline.handle(event, now), now)
        if isinstance(event, Tick):
            return self._route(self.auction.handle(event, now)
                               + self.pipeline.handle(event, now), now)
        if isinstance(event, SubmitTask) and event.task_id is not None \
                and self.pipeline.is_child(event.task_id):
            try:
                return self._route(self.auction.handle(event, now), now)
            except LocalProtocolError as exc:  # the child ends here; its plan goes on
                return self._route(self.pipeline.handle(ChildFinished(
                    event.task_id, (), f"refused by the auction: {exc}"), now), now)
        return self._route(self.auction.handle(event, now), now)

    def next_deadline(self) -> int | None:
        times = [t for t in (self.auction.next_deadline(), self.pipeline.next_deadline())
                 if t is not None]
        return min(times) if times else None

    def _route(self, effects: list[Effect], now: int) -> list[Effect]:
        out: list[Effect] = []
        pending = list(effects)
        for _ in range(MAX_ROUTING):
            if not pending:
                break
            more: list[Effect] = []
            for effect in pending:
                if isinstance(effect, (Reward, CancelTask)):
                    more += self.auction.handle(effect, now)
                    continue
                out.append(effect)
                if isinstance(effect, TaskUpdated):
                    done = child_finished(effect.snapshot.data)
                    if done is not None and self.pipeline.is_child(done.task_id):
                        more += self.pipeline.handle(done, now)
            pending = more
        return out
