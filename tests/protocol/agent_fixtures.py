"""Test helpers for agent cards: a card, a node's record of cards, and the record signed as is
(without seal_agent_cards's own checks, so tests can sign what an honest node never would)."""

from __future__ import annotations

from typing import Any

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol.agents.cards import AGENTS_DOMAIN, AgentCard, AgentCards, AgentTool
from protocol.agents.matching import quantize
from protocol.codec import encode

NET = "testnet"
T0 = 1_700_000_000_000
MINUTE = 60_000
HOUR = 60 * MINUTE
EMBEDDER = bytes(range(32))


def identity(i: int) -> Identity:
    return Identity.from_seed(i.to_bytes(32, "big"))


def card(name: str = "calc", vector: tuple[float, ...] = (0.6, -0.8, 0.0),
         **kw: Any) -> AgentCard:
    data, scale = quantize(vector)
    base: dict[str, Any] = dict(
        name=name,
        description="Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly.",
        skills=("arithmetic", "math"),
        model=None,
        adapter=None,
        tools=(AgentTool(name="calculator", description="exact arithmetic", side_effects=False),),
        price_per_1k_tokens=0.5,
        embedding=data,
        embedding_scale=scale,
        embedder_hash=EMBEDDER,
    )
    base.update(kw)
    return AgentCard(**base)


def cards_record(who: Identity, seq: int = 1, *, cards: tuple[AgentCard, ...] | None = None,
                 network: str = NET, issued: int = T0, ttl: int = 30 * MINUTE,
                 peer_id: str | None = None) -> AgentCards:
    return AgentCards(
        network_id=network,
        peer_id=peer_id if peer_id is not None else who.peer_id,
        seq=seq,
        issued_at_ms=issued,
        expires_at_ms=issued + ttl,
        cards=cards if cards is not None else (card(),),
    )


def cards_ledger(records: dict[str, tuple[AgentCard, ...]]) -> dict[str, AgentCards]:
    """Agent-card records by peer, as a requester's ledger holds them (unsigned: the auction
    reads them through its matcher)."""
    return {peer: cards_record(identity(2), cards=cs, peer_id=peer)
            for peer, cs in records.items()}


def signed(who: Identity, seq: int = 1, **kw: Any) -> Envelope:
    record = cards_record(who, seq, **kw)
    return Envelope.sign(who, AGENTS_DOMAIN, encode(record))
