"""A deterministic little world for plan mode: one requester's ``PlanningRequester`` and the
executors' ``Executor`` machines, on a virtual clock, every message through the wire codec.

The requester is the daemon's machine (protocol/agents/planning.py), built here by
:func:`plan_requester` as node/market/requester.py builds it (an ``Auction`` and a
``PlanPipeline`` over the same seeded ``rng``), or handed in as the daemon built it (the
one-copy test). Each executor hosts agent cards; what an agent computes comes from
``answer(peer, start, now) -> ComputeDone | None`` (None: it accepts and stays silent, so the
auction's timeout reroutes the step). A child ``SubmitTask`` the requester emits is handed
back to it, as the daemon's tasks service does; ``PlanUpdated`` snapshots are kept.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any

from crypto.keys import Identity
from protocol.agents.pipeline import PipelineConfig, PlanPipeline
from protocol.agents.plan_runs import PlanUpdated
from protocol.agents.planning import PlanningRequester
from protocol.codec import Message, decode, encode
from protocol.machine import Publish, Received, Send, Tick
from protocol.market.auction import Auction, AuctionConfig, AuctionOptions, SubmitTask
from protocol.market.executor import ComputeDone, Executor, StartCompute
from protocol.market.selection import Selector

#: one-way delay of every message
LATENCY_MS = 5

Answer = Callable[[str, StartCompute, int], "ComputeDone | None"]


def plan_requester(identity: Identity, selector: Selector, rng: random.Random,
                   config: AuctionConfig, pipeline: PipelineConfig,
                   options: AuctionOptions) -> PlanningRequester:
    """The requester as the daemon's tasks service builds it without [verify]: an ``Auction``
    given ``options`` and a ``PlanPipeline`` (the same reputation) drawing child ids from the
    same ``rng``."""
    auction = Auction(identity, selector, rng, config, options)
    return PlanningRequester(auction, PlanPipeline(pipeline, options.reputation,
                                                   lambda: rng.randbytes(32)))


class PlanWorld:
    def __init__(self, requester: PlanningRequester, requester_id: str,
                 executors: dict[str, Executor], answer: Answer,
                 latency: dict[str, int] | None = None) -> None:
        self.requester = requester
        self.rq = requester_id
        self.executors = executors
        self.answer = answer
        #: each node's own link delay, added to ``LATENCY_MS`` at both ends of a message
        self.latency = latency or {}
        self.now = 0
        self._seq = 0
        self._queue: list[tuple[int, int, str, object]] = []
        self.plans: dict[str, dict[str, object]] = {}
        self.counters: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _schedule(self, at: int, dest: str, event: object) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, dest, event))

    def _deliver(self, src: str, dest: str, msg: Message, topic: str | None = None) -> None:
        self._count("messages")
        delay = LATENCY_MS + self.latency.get(src, 0) + self.latency.get(dest, 0)
        self._schedule(self.now + delay, dest, Received(src, decode(encode(msg)), topic))

    def perform(self, src: str, effects: list[Any]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self._deliver(src, e.peer, e.message)
            elif isinstance(e, Publish):
                for peer in self.executors:
                    if peer != src:
                        self._deliver(src, peer, e.message, e.topic)
            elif isinstance(e, SubmitTask) and src == self.rq:  # a child: handed back
                self.perform(src, self.requester.handle(e, self.now))
            elif isinstance(e, PlanUpdated):
                self.plans[str(e.snapshot["task_id"])] = e.snapshot
            elif isinstance(e, StartCompute):
                self._count("computations")
                done = self.answer(src, e, self.now)
                if done is not None:
                    self._schedule(self.now + done.compute_ms, src, done)
            # Attest, Emit, Penalize, TaskUpdated, CancelCompute: nothing to do here

    def submit(self, event: object) -> None:
        self.perform(self.rq, self.requester.handle(event, self.now))

    def _machine(self, peer: str) -> Any:
        return self.requester if peer == self.rq else self.executors[peer]

    def run_until(self, until: int, done: Callable[[], bool]) -> None:
        """Deliver events and ticks in time order until ``done()`` or the clock reaches
        ``until``."""
        while not done():
            ticks = [(d, p) for p in (self.rq, *self.executors)
                     if (d := self._machine(p).next_deadline()) is not None]
            tick = min(ticks) if ticks else None
            at_msg = self._queue[0][0] if self._queue else None
            times = [t for t in (at_msg, tick[0] if tick else None) if t is not None]
            if not times or min(times) > until:
                self.now = until
                return
            t = min(times)
            self.now = max(self.now, t)
            if at_msg is not None and at_msg == t:
                _, _, dest, event = heapq.heappop(self._queue)
                self.perform(dest, self._machine(dest).handle(event, self.now))
            else:
                assert tick is not None
                self.perform(tick[1], self._machine(tick[1]).handle(Tick(), self.now))
