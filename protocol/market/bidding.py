"""Requester side, bidding: beacons out, bids in, executors chosen and assigned.

``Bidding`` is a component the ``protocol.market.auction.Auction`` holds (which documents the
promises and owns the task table; bidding keeps only each peer's recent bid times). A round's
beacon opens a bid window of at most ``bid_window_ms`` (and a third of the time left); a bid
is accepted only if it opens as signed and sent by its bidder, is for a task in that round's
open window, within budget, above ``min_match`` (the match the requester computes itself,
``match_of``: from the bidder's agent card in our ledger for a task that names a need, the
bid refused when there is no such card or the task names another agent; the bid's model
match for a task that names none), from a peer not yet tried (nor ourselves,
unless the task allows it), within ``max_bids_per_task`` and not over ``bid_rate`` per
``rate_window_ms``; a valid bid we will not use is answered with a ``Cancel`` that releases the
bidder's slot. A valid bid that missed its window (an earlier round's, or one closed already)
is kept as a spare for the auction to use at once while the task still lacks executors: on a
loaded machine bids come seconds late, and refusing them left the executors idle while the
tasks they bid on waited out a backoff for the next round.

``take`` says what the auction does next (``BidNext``): the window closes as soon as waiting
longer cannot improve the choice, then ``pick`` has the selector choose the executors, each gets
a signed assignment with its own deadline, the other bids stay as spares. That is the first of:
* every peer that could bid has (``possible_bidders``: the ledger's live peers serving a
  matching model, less those already tried for the task);
* ``wanted + spare_bids`` bids are in, once the bids are ``settled``;
* ``close_grace_ms`` after the bid that made ``wanted``, once the bids are ``settled``: bids
  answer a gossiped beacon within a round trip or two, so a bid later than that comes from a
  slow or loaded peer, which the selector ranks low on latency and load anyway; waiting for it
  costs every task the whole window (1.5 s by default, against about 1 s of compute for a
  short answer);
* the window's deadline.
The bids are ``settled`` when a later bid cannot bring a better match: always for a task that
names no need (every fitting executor's match comes from its model, and the selector's other
inputs favour the prompt bidders), and for a task that names one (a plan's step, an ask with
skills) only once the ``wanted`` best matches in hand reach ``MATCH_CEILING``. A need's
matches differ by agent, a specialist's far above a generalist's, and the order in which bids
arrive says where a node sits, not how well its agent fits: closing at the first arrivals
handed a step to the nearest generalists while the calculator agent's bid was still on its
way. Such a window stays open until every possible bidder has bid (the usual case: every node
hosts an agent and bids) or its deadline passes.
``pick`` never chooses a peer ``excluded`` says to leave out (verification's convicted peers).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from crypto.keys import Identity
from protocol.agents.wire import has_need
from protocol.envelopes import seal
from protocol.machine import Effect, Emit, Publish, Send
from protocol.market.events import AuctionConfig, TaskUpdated
from protocol.market.messages import (
    ASSIGN_DOMAIN,
    BEACON_DOMAIN,
    BEACON_TOPIC,
    BID_DOMAIN,
    Assign,
    AssignBody,
    Beacon,
    BeaconBody,
    Bid,
    BidBody,
    Cancel,
)
from protocol.market.options import AuctionOptions
from protocol.market.refusals import count, opened, rejecter
from protocol.market.selection import Candidate, Selector, assignment_ms
from protocol.market.state import (
    Attempt,
    AttemptState,
    BidInfo,
    OpenTask,
    TaskPhase,
    snapshot,
)

PENALTY_RATE = 2
#: the highest match there is (protocol/agents/matching.py, protocol/market/offers.py): bids
#: that hold it cannot be beaten by a later one
MATCH_CEILING = 1.0


@dataclass
class RateWindow:
    """When one peer's recent bids arrived (within ``rate_window_ms``), oldest first."""

    times: deque[int] = field(default_factory=deque)


class BidNext(enum.Enum):
    """What the auction does after a bid was taken."""

    WAIT = "wait"  # the window stays open (its close perhaps brought forward)
    CLOSE = "close"  # waiting longer cannot improve the choice: close the window now
    SPARE = "spare"  # a late bid kept as a spare: replan, which may assign it at once


@dataclass(slots=True)
class TakenBid:
    task: OpenTask
    next: BidNext
    effects: list[Effect]


class Bidding:
    """Beacons, bid checks, picking and assigning for the ``Auction`` that holds it."""

    def __init__(self, identity: Identity, config: AuctionConfig, selector: Selector,
                 options: AuctionOptions, counters: dict[str, int]) -> None:
        self.identity = identity
        self.peer = identity.peer_id
        self.config = config
        self.selector = selector
        self.options = options
        self.counters = counters
        self.rates: dict[str, RateWindow] = {}

    def beacon(self, task: OpenTask, now: int) -> list[Effect]:
        """Open a bid round for ``task``: a signed beacon, its window set."""
        remaining = task.deadline_at_ms - now
        window = max(1, min(self.config.bid_window_ms, remaining // 3))
        task.window_closes_at_ms = now + window
        task.bids.clear()
        spec = task.spec
        body = BeaconBody(
            task_id=spec.task_id, requester=self.peer, round=task.round,
            requirement=spec.requirement, wanted=max(1, task.needed), max_price=spec.max_price,
            max_tokens=spec.max_tokens, bid_window_ms=window, deadline_ms=max(1, remaining),
            allow_self=task.allow_self,
        )
        count(self.counters, "beacons_sent")
        return [
            Publish(BEACON_TOPIC, Beacon(envelope=seal(self.identity, BEACON_DOMAIN, body))),
            Emit("task.beacon", {"task_id": spec.task_id.hex(), "round": task.round,
                                 "wanted": body.wanted, "window_ms": window}),
            TaskUpdated(snapshot(task)),
        ]

    def _rate_limited(self, peer: str, now: int) -> bool:
        rate = self.rates.setdefault(peer, RateWindow())
        while rate.times and rate.times[0] <= now - self.config.rate_window_ms:
            rate.times.popleft()
        if len(rate.times) >= self.config.bid_rate:
            return True
        rate.times.append(now)
        if len(self.rates) > 4 * self.config.max_open_tasks * self.config.max_bids_per_task:
            for p in [p for p, r in self.rates.items() if not r.times]:
                del self.rates[p]
        return False

    def take(self, peer: str, msg: Bid, tasks: dict[bytes, OpenTask],
             now: int) -> TakenBid | list[Effect]:
        """Check a bid and keep it (in the window, or as a spare when late); else the
        refusal's effects."""
        reject = rejecter(self.counters, "task", "bid", peer)

        if self._rate_limited(peer, now):
            return reject("rate_limited", PENALTY_RATE)
        body = opened(msg.envelope, BID_DOMAIN, BidBody, self.config.max_frame, peer,
                      lambda b: b.bidder, reject)
        if isinstance(body, list):
            return body
        task = tasks.get(body.task_id)
        if task is None:
            return reject("unknown_task")
        if peer in task.bids or peer in task.tried or peer in task.spares:
            return reject("duplicate")

        def refuse(why: str) -> list[Effect]:
            # a valid bid we will not use: release the slot the bidder holds for it
            return reject(why) + [Send(peer, Cancel(task_id=body.task_id, attempt=-1))]

        if peer == self.peer and not task.allow_self:
            return refuse("self")
        if body.price > task.spec.max_price:
            return refuse("over_budget")
        req = task.spec.requirement
        if req.agent and body.agent != req.agent:
            return refuse("other_agent")
        match = self.match_of(peer, body, task)
        if match is None:
            return refuse("no_card")
        if match < self.config.min_match:
            return refuse("poor_match")
        if task.phase is not TaskPhase.BIDDING or body.round != task.round \
                or now >= task.window_closes_at_ms:
            return self._late(task, BidInfo(body, now, now + body.hold_ms, match), refuse)
        if len(task.bids) >= self.config.max_bids_per_task:
            return refuse("too_many")
        task.bids[peer] = BidInfo(body, now, now + body.hold_ms, match)
        count(self.counters, "bids_accepted")
        effects: list[Effect] = [Emit("task.bid", {"task_id": body.task_id.hex(), "peer": peer,
                                                    "agent": body.agent, "match": match,
                                                    "price": body.price})]
        if self._all_bid(task):
            return TakenBid(task, BidNext.CLOSE, effects)
        if not self._settled(task):
            return TakenBid(task, BidNext.WAIT, effects)
        if len(task.bids) >= task.needed + self.config.spare_bids:
            return TakenBid(task, BidNext.CLOSE, effects)
        if len(task.bids) >= task.needed:
            task.window_closes_at_ms = min(task.window_closes_at_ms,
                                           now + self.config.close_grace_ms)
        return TakenBid(task, BidNext.WAIT, effects)

    def match_of(self, peer: str, body: BidBody, task: OpenTask) -> float | None:
        """The bid's match as this requester computes it: from ``peer``'s card for the bid's
        agent when the task names a need (None: no such card), else the model match the bid
        states (the model rule, protocol/market/offers.py, is the same on both sides)."""
        req = task.spec.requirement
        if has_need(req):
            match = self.options.agent_match(peer, body.agent, req)
            return None if match is None else min(1.0, max(0.0, match))
        return body.match_score

    def _late(self, task: OpenTask, info: BidInfo,
              refuse: Callable[[str], list[Effect]]) -> TakenBid | list[Effect]:
        """A valid bid that missed its round's window: kept as a spare while the task still
        lacks executors; refused (its place released) when it no longer does."""
        body = info.body
        if task.finished or task.needed == 0 or body.round > task.round:
            return refuse("late")
        task.spares[body.bidder] = info
        count(self.counters, "late_bids_used")
        return TakenBid(task, BidNext.SPARE, [Emit("task.late_bid_used", {
            "task_id": body.task_id.hex(), "peer": body.bidder, "round": body.round})])

    def _settled(self, task: OpenTask) -> bool:
        """Whether a later bid cannot bring a better match (the module docstring says when)."""
        if not has_need(task.spec.requirement):
            return True
        best = sorted((b.match for b in task.bids.values()), reverse=True)[:max(1, task.needed)]
        return len(best) >= max(1, task.needed) and best[-1] >= MATCH_CEILING

    def _all_bid(self, task: OpenTask) -> bool:
        possible = self.options.possible_bidders(task)
        return possible is not None and len(task.bids) >= possible - len(task.tried)

    def _candidate(self, task: OpenTask, info: BidInfo, now: int) -> Candidate:
        b = info.body
        return Candidate(
            peer=b.bidder, match_score=info.match, reputation=self.options.reputation(b.bidder),
            price=b.price, max_price=task.spec.max_price, est_latency_ms=b.est_latency_ms,
            deadline_ms=max(0, task.deadline_at_ms - now), load=b.load, free_slots=b.free_slots,
        )

    def pick(self, task: OpenTask, pool: dict[str, BidInfo], now: int) -> list[Effect]:
        """Assign up to ``task.needed`` executors chosen from ``pool`` (which is consumed;
        excluded peers' bids are dropped from it)."""
        for peer in [p for p in pool if self.options.excluded(p, now)]:
            del pool[peer]
            count(self.counters, "bids_excluded")
        usable = {p: b for p, b in pool.items() if p not in task.tried and now < b.hold_until_ms}
        chosen = self.selector.select(
            task.spec.task_id, [self._candidate(task, b, now) for b in usable.values()],
            task.needed,
        )
        effects: list[Effect] = []
        for c in chosen:
            info = usable.pop(c.peer, None)
            if info is not None and task.needed > 0:
                effects.extend(self._assign(task, info, now))
        pool.clear()
        pool.update(usable)
        return effects

    def _assign(self, task: OpenTask, info: BidInfo, now: int) -> list[Effect]:
        b = info.body
        due = now + assignment_ms(self.config.assign_base_ms, self.config.assign_slack,
                                  b.est_latency_ms, task.deadline_at_ms - now)
        attempt = Attempt(task.next_attempt, b.bidder, info, AttemptState.ASSIGNED, now, due)
        task.next_attempt += 1
        task.attempts[attempt.attempt] = attempt
        task.tried.add(b.bidder)
        if task.first_assigned_at_ms is None:
            task.first_assigned_at_ms = now
        body = AssignBody(task=task.spec, executor=b.bidder, attempt=attempt.attempt,
                          round=task.round, model=b.model, deadline_ms=max(1, due - now),
                          agent=b.agent, stream=task.stream)
        count(self.counters, "assigned")
        return [
            Send(b.bidder, Assign(envelope=seal(self.identity, ASSIGN_DOMAIN, body))),
            Emit("task.assigned", {"task_id": task.spec.task_id.hex(), "peer": b.bidder,
                                   "attempt": attempt.attempt, "due_in_ms": due - now}),
        ]
