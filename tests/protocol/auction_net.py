"""An auction machine and its bidders, for the auction and late-bid tests: submitting a task,
a signed bid, and the assignments an auction sent."""

from __future__ import annotations

import random

from protocol.envelopes import open_envelope, seal
from protocol.machine import Received, Send
from protocol.market.auction import Auction, AuctionConfig, SubmitTask
from protocol.market.messages import ASSIGN_DOMAIN, BID_DOMAIN, Assign, AssignBody, Bid, BidBody
from protocol.market.selection import ScoreSelector
from tests.protocol.market_net import MODEL, ident

ME = ident(1)
BIDDERS = [ident(20 + i) for i in range(6)]


class RecordingSelector(ScoreSelector):
    def __init__(self) -> None:
        super().__init__()
        self.observed: list[tuple[bytes, str, float]] = []

    def observe(self, task_id: bytes, peer: str, reward: float) -> None:
        self.observed.append((task_id, peer, reward))


def auction(**kw: object) -> tuple[Auction, RecordingSelector]:
    sel = RecordingSelector()
    return Auction(ME, sel, random.Random(1), AuctionConfig(**kw)), sel  # type: ignore[arg-type]


def submit(a: Auction, now: int = 0, **kw: object) -> tuple[bytes, list[object]]:
    fields: dict[str, object] = {"question": "1+1?", "answer_type": "number",
                                 "deadline_ms": 20_000, "k": 2, "max_price": 5.0}
    fields.update(kw)
    effects = a.handle(SubmitTask(**fields), now)  # type: ignore[arg-type]
    return list(a.tasks)[-1], effects


def bid(task_id: bytes, who=BIDDERS[0], round_: int = 0, price: float = 1.0,  # type: ignore[no-untyped-def]
        match: float = 1.0, latency: int = 1_000, hold: int = 5_000) -> Received:
    body = BidBody(task_id=task_id, round=round_, bidder=who.peer_id, model=MODEL.name,
                   model_hash=MODEL.model_hash, match_score=match, price=price,
                   est_latency_ms=latency, load=0.0, free_slots=1, hold_ms=hold)
    return Received(who.peer_id, Bid(envelope=seal(who, BID_DOMAIN, body)))


def assigns(effects: list[object]) -> list[AssignBody]:
    return [open_envelope(e.message.envelope, ASSIGN_DOMAIN, AssignBody, 1 << 20)
            for e in effects if isinstance(e, Send) and isinstance(e.message, Assign)]
