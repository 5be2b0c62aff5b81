"""The daemon's ledger service with agent cards, driven by hand-made signed records: an honest
card's vector is verified, a card whose vector is not its description's is refused (dropped
from the ledger and the store) and its author penalized, a card of another embedder is kept
unverified; this node's own cards are embedded, published and listed by ``GET /agents``.

The embedder here is a deterministic stand-in (letter counts, normalized) so the test needs no
model; the real one is exercised by tests/node/test_agents_integration.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
from starlette.testclient import TestClient

from crypto.envelope import Envelope
from crypto.keys import Identity
from node.agents.api import agents_routes
from node.agents.checks import CardEmbedder
from node.agents.config import parse_agents
from node.db import Database
from node.ledger.service import LedgerService
from node.ledger.store import SCHEMA
from node.logs import get_logger
from node.service import NodeContext
from protocol.agents.cards import AGENTS_DOMAIN, AgentCard, AgentCards
from protocol.agents.matching import quantize
from protocol.codec import encode
from protocol.ledger.machine import ForgetAgentCards, StoreAgentCards
from protocol.ledger.messages import LedgerPush
from protocol.machine import Penalize, Received

NET = "agents-test"
FAKE_HASH = bytes(range(32))
CALC = "Exact arithmetic: adds, subtracts, multiplies and divides numbers exactly."
POEMS = "Writes short rhyming poems about the sea."


class LetterEmbedder:
    """Texts to unit vectors of letter counts: deterministic, distinct texts apart."""

    hash = FAKE_HASH

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        out = []
        for text in texts:
            counts = [float(text.lower().count(chr(97 + i))) for i in range(26)]
            norm = math.sqrt(sum(c * c for c in counts)) or 1.0
            out.append([c / norm for c in counts])
        return out


def card(name: str, description: str, vector_of: str, embedder_hash: bytes = FAKE_HASH
         ) -> AgentCard:
    data, scale = quantize(LetterEmbedder().embed([vector_of])[0])
    return AgentCard(name=name, description=description, skills=("math",), model="m",
                     adapter=None, tools=(), price_per_1k_tokens=1.0, embedding=data,
                     embedding_scale=scale, embedder_hash=embedder_hash)


def signed(who: Identity, now_ms: int, *cards: AgentCard) -> Envelope:
    record = AgentCards(network_id=NET, peer_id=who.peer_id, seq=now_ms, issued_at_ms=now_ms,
                        expires_at_ms=now_ms + 600_000, cards=cards)
    return Envelope.sign(who, AGENTS_DOMAIN, encode(record))


class Harness:
    """A LedgerService whose ctx.submit feeds its machine and performs the effects."""

    def __init__(self, tmp_path: Path, embedder: LetterEmbedder) -> None:
        self.identity = Identity.from_seed(b"\x01" * 32)
        self.db = Database(tmp_path / "node.db")
        self.db.apply_schema(SCHEMA)
        self.penalties: list[Penalize] = []
        self.clock_ms = 1_000
        config = SimpleNamespace(
            agents=parse_agents([{"name": "calc", "description": CALC, "skills": ["math"],
                                  "tools": ["calculator", "files.write"]}], "test"),
            section=lambda name: (_ for _ in ()).throw(KeyError(name)))
        ctx = NodeContext(
            identity=self.identity, network_id=NET, data_dir=tmp_path, config=config,
            db=self.db, transport=SimpleNamespace(listen_addrs=lambda: []),
            log=get_logger(), rng=random.Random(0), clock=lambda: self.clock_ms,
            submit=self.submit, services={})
        self.service = LedgerService(ctx)
        self.service.agents.embedder = CardEmbedder(load=lambda: embedder,
                                                    peek_hash=lambda: FAKE_HASH)
        self.service.agents.checker.embedder = self.service.agents.embedder

    async def submit(self, name: str, event: object) -> None:
        await self.perform(self.service.machine.handle(event, self.clock_ms))

    async def perform(self, effects: list[object]) -> None:
        for effect in effects:
            if isinstance(effect, Penalize):
                self.penalties.append(effect)
            elif isinstance(effect, (StoreAgentCards, ForgetAgentCards)):
                await self.service.perform(effect)

    async def push(self, sender: str, *envelopes: Envelope) -> None:
        push = LedgerPush(records=(), attestations=(), reply=False, more=False, agents=envelopes)
        await self.perform(self.service.machine.handle(Received(sender, push, "ledger"),
                                                       self.clock_ms))

    def stored_agents(self) -> set[str]:
        return {r[0] for r in self.db.query("SELECT peer_id FROM ledger_agents")}


def test_cards_are_checked_refused_with_a_penalty_and_listed(tmp_path: Path) -> None:
    embedder = LetterEmbedder()
    h = Harness(tmp_path, embedder)
    honest, liar, other = (Identity.from_seed(bytes([i]) * 32) for i in (2, 3, 4))
    now = h.service.now_ms()

    async def main() -> None:
        checker = h.service.agents.checker
        await h.push(honest.peer_id, signed(honest, now, card("calc", CALC, CALC)))
        # a card that says arithmetic but carries a poem-writer's vector
        bad = signed(liar, now, card("calc", CALC, CALC), card("sum", CALC, POEMS))
        await h.push(honest.peer_id, bad)  # relayed by another node: the author pays
        await h.push(other.peer_id, signed(other, now, card("calc", CALC, POEMS, bytes(32))))
        assert list(checker.pending) == [honest.peer_id, liar.peer_id, other.peer_id]
        while checker.pending:  # what checker.run does, one record at a time
            await checker.check(checker.pending.pop(next(iter(checker.pending))))

        assert h.penalties == [Penalize(liar.peer_id, "ledger:vector_mismatch", 20)]
        view = h.service.machine.view
        assert view.agents(liar.peer_id) is None and liar.peer_id not in h.stored_agents()
        assert h.service.machine.rejections() == {liar.peer_id: {"vector_mismatch": 1}}
        await h.push(honest.peer_id, bad)  # the same bytes again: ignored, nobody pays
        assert len(h.penalties) == 1 and not checker.pending

        h.service.agents.resolve(["m"])
        await h.service.agents.publish(price=0.5)
        assert h.stored_agents() == {h.identity.peer_id, honest.peer_id, other.peer_id}

    trio.run(main)
    entries = {(e.peer_id, e.card.name): e for e in h.service.agents.entries()}
    assert set(entries) == {(honest.peer_id, "calc"), (other.peer_id, "calc"),
                            (h.identity.peer_id, "calc")}
    good, foreign, own = (entries[(p, "calc")]
                          for p in (honest.peer_id, other.peer_id, h.identity.peer_id))
    assert good.verified and good.vector is not None
    assert not foreign.verified and foreign.vector is None  # another embedder: tags only
    assert own.own and own.verified and own.card.embedder_hash == FAKE_HASH
    assert [(t.name, t.side_effects) for t in own.card.tools] == [
        ("calculator", False), ("files.write", True)]  # unknown tools: side-effecting
    assert own.card.price_per_1k_tokens == 0.5 and own.card.model == "m"

    client = TestClient(_app(h.service))
    listed = client.get("/agents").json()
    assert listed["count"] == 3
    mine = next(a for a in listed["agents"] if a["self"])
    assert mine["vector_verified"] and mine["tools"][1] == {
        "name": "files.write", "description": "", "side_effects": True}
    assert {a["peer_id"]: a["vector_verified"] for a in listed["agents"]} == {
        honest.peer_id: True, other.peer_id: False, h.identity.peer_id: True}
    assert client.get("/agents", params={"peer": other.peer_id}).json()["count"] == 1


def test_a_node_without_an_embedder_publishes_cards_without_vectors(tmp_path: Path) -> None:
    h = Harness(tmp_path, LetterEmbedder())
    h.service.agents.embedder = off = CardEmbedder(enabled=False)
    h.service.agents.checker.embedder = off
    peer = Identity.from_seed(b"\x05" * 32)

    async def main() -> None:
        await h.push(peer.peer_id, signed(peer, h.service.now_ms(), card("calc", CALC, POEMS)))
        checker = h.service.agents.checker
        await checker.check(checker.pending.pop(peer.peer_id))
        h.service.agents.resolve(["m"])
        await h.service.agents.publish(price=0.0)

    trio.run(main)
    assert h.penalties == []  # nothing can be checked: nothing refused
    (own,) = [e for e in h.service.agents.entries() if e.own]
    assert own.card.embedding == b"" and own.card.embedder_hash == b"" and not own.verified
    assert not [e for e in h.service.agents.entries() if e.verified]


class BrokenEmbedder(LetterEmbedder):
    """Loads, then raises on every embedding: the card embedder whose parameters were left
    on the meta device by a model another thread was building (models/building.py)."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")


def test_an_embedder_that_raises_costs_the_vectors_not_the_ledger_service(
        tmp_path: Path) -> None:
    """Its error went out of ``publish`` and ended the ledger service's nursery: the daemon."""
    broken = BrokenEmbedder()
    h = Harness(tmp_path, broken)
    peer = Identity.from_seed(b"\x07" * 32)

    async def main() -> None:
        h.service.agents.resolve(["m"])
        await h.service.agents.publish(price=0.0)
        assert h.service.agents.published.is_set()
        await h.push(peer.peer_id, signed(peer, h.service.now_ms(), card("calc", CALC, CALC)))
        checker = h.service.agents.checker
        await checker.check(checker.pending.pop(peer.peer_id))

    trio.run(main)
    assert broken.calls == 2  # publishing and the peer's check both tried the model
    embedder = h.service.agents.embedder
    assert embedder.problem == ("embedding failed: RuntimeError: Tensor.item() cannot be "
                                "called on meta tensors")
    (own,) = [e for e in h.service.agents.entries() if e.own]
    assert own.card.embedding == b"" and own.card.embedder_hash == b""
    assert h.penalties == []  # a peer's card we could not embed is unverified, not refused
    assert not [e for e in h.service.agents.entries() if e.verified and not e.own]


def test_a_newer_record_replaces_the_one_waiting_for_its_check(tmp_path: Path) -> None:
    h = Harness(tmp_path, LetterEmbedder())
    peer = Identity.from_seed(b"\x06" * 32)
    now = h.service.now_ms()

    async def main() -> None:
        await h.push(peer.peer_id, signed(peer, now, card("calc", CALC, CALC)))
        await h.push(peer.peer_id, signed(peer, now + 1, card("calc", CALC, CALC),
                                          card("poet", POEMS, POEMS)))
        checker = h.service.agents.checker
        (waiting,) = checker.pending.values()  # one check per node waits: the newer record
        assert len(waiting.record.cards) == 2
        await checker.check(checker.pending.pop(peer.peer_id))
        assert checker.checked == 1

    trio.run(main)
    assert sorted(e.card.name for e in h.service.agents.entries() if e.verified) == [
        "calc", "poet"]


def _app(service: Any) -> Any:
    from starlette.applications import Starlette

    return Starlette(routes=agents_routes(service))
