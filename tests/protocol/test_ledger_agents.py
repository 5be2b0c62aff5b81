"""Agent cards in the ledger machine: published, spread, synced, replaced by seq, expired,
restored; forged, oversized, over-limit and malformed records refused with a penalty; a record
refused after intake (its vector) dropped, its author penalized, and never taken back."""

from __future__ import annotations

import dataclasses

import pytest

from crypto.envelope import Envelope
from protocol.agents.cards import (
    AGENTS_DOMAIN,
    MAX_AGENT_CARDS_BYTES,
    MAX_AGENTS_PER_NODE,
    AgentCards,
    open_agent_cards,
)
from protocol.codec import encode
from protocol.errors import LocalProtocolError
from protocol.ledger.machine import (
    ForgetAgentCards,
    LedgerConfig,
    RefuseAgentCards,
    SetAgents,
    StoreAgentCards,
)
from protocol.ledger.messages import LedgerPush
from protocol.ledger.records import PENALTY_POINTS, Rejection
from protocol.machine import Penalize, Publish, Received, Tick
from tests.protocol.agent_fixtures import card, cards_record, signed
from tests.protocol.ledger_net import MINUTE, NET, T0, Net, identity, machine

A, B, C = identity(1), identity(2), identity(3)
SENDER = identity(9).peer_id
GENERALIST = card("generalist", description="General assistant.", skills=("general",),
                  tools=())


def push(*envelopes: Envelope, reply: bool = False) -> LedgerPush:
    return LedgerPush(records=(), attestations=(), reply=reply, more=False, agents=envelopes)


def penalties(effects: list[object]) -> dict[str, int]:
    return {e.reason: e.points for e in effects if isinstance(e, Penalize)}


def test_set_agents_signs_stores_and_publishes_a_checkable_record() -> None:
    m = machine(0)
    effects = m.handle(SetAgents((card(), GENERALIST)), T0)
    (store,) = [e for e in effects if isinstance(e, StoreAgentCards)]
    (pub,) = [e for e in effects if isinstance(e, Publish)]
    assert isinstance(pub.message, LedgerPush) and pub.message.agents == (store.envelope,)
    record = open_agent_cards(store.envelope, NET, T0)
    assert record.peer_id == m.peer_id and record.seq >= T0
    assert [c.name for c in record.cards] == ["calc", "generalist"]
    assert m.view.agents(m.peer_id, T0) == record
    with pytest.raises(LocalProtocolError):  # peers would refuse it: refused here first
        m.handle(SetAgents((card("bad name"),)), T0)
    with pytest.raises(LocalProtocolError):
        m.handle(SetAgents(tuple(card(f"a{i}") for i in range(MAX_AGENTS_PER_NODE + 1))), T0)


def test_cards_spread_by_gossip_and_by_sync_and_newer_seq_replaces() -> None:
    cfg = LedgerConfig(min_republish_ms=1_000, refresh_ms=60_000, record_ttl_ms=180_000)
    net = Net()
    a, b, c = (net.add(machine(i, cfg)) for i in (1, 2, 3))
    net.connect(a.peer_id, b.peer_id)
    net.run()
    net.feed(a.peer_id, SetAgents((card(),)))
    net.run()
    assert b.view.agents(a.peer_id, T0) is not None  # by gossip
    net.connect(b.peer_id, c.peer_id)  # c never met a: it pulls a's cards from b by sync
    net.run()
    assert c.view.agents(a.peer_id, T0) == a.view.agents(a.peer_id, T0)
    assert len(net.digests()) == 1
    first = a.view.agents(a.peer_id, T0)
    assert first is not None
    net.feed(a.peer_id, SetAgents((card(), GENERALIST)))  # changed: republished when due
    net.run()
    net.advance(T0 + 1_000)  # gossip reaches b; c, a's peer's peer, gets it by anti-entropy
    net.advance(T0 + cfg.anti_entropy_ms + 1_000)
    for m in (a, b, c):
        now = m.view.agents(a.peer_id, net.now)
        assert now is not None and now.seq > first.seq and len(now.cards) == 2
    # the old record replayed is refused as a replay and costs its sender
    held = c.state.cards.held[a.peer_id]
    replay = Envelope.sign(A, AGENTS_DOMAIN, encode(first))
    effects = c.handle(Received(SENDER, push(replay), "ledger"), net.now)
    assert penalties(effects) == {"ledger:seq_replay": PENALTY_POINTS[Rejection.SEQ_REPLAY]}
    assert c.state.cards.held[a.peer_id].hash == held.hash


def test_cards_expire_then_are_forgotten_and_refresh_keeps_own_alive() -> None:
    m = machine(0)
    m.handle(Received(SENDER, push(signed(A, 1, ttl=10 * MINUTE)), "ledger"), T0)
    assert [h.record.peer_id for h in m.view.agent_records(T0)] == [A.peer_id]
    assert m.view.agents(A.peer_id, T0 + 10 * MINUTE) is None  # expired: no longer counts
    assert m.state.digest(T0 + 10 * MINUTE).agents == ()
    gone = m.handle(Tick(), T0 + 10 * MINUTE + m.state.cards.tombstone_ms)
    assert ForgetAgentCards((A.peer_id,)) in gone
    assert A.peer_id not in m.state.cards.held
    cfg = LedgerConfig(refresh_ms=60_000, record_ttl_ms=180_000)
    own = machine(1, cfg)
    own.handle(SetAgents((card(),)), T0)
    assert own.next_deadline() == T0 + 60_000
    republished = own.handle(Tick(), T0 + 60_000)
    (store,) = [e for e in republished if isinstance(e, StoreAgentCards)]
    assert store.record.expires_at_ms == T0 + 60_000 + 180_000


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        # signed by B, claiming to be A's cards
        (lambda: signed(B, 1, peer_id=A.peer_id), Rejection.SIGNER_NOT_SUBJECT),
        # A's key, B's signature
        (lambda: dataclasses.replace(signed(B, 1, peer_id=A.peer_id),
                                     public_key=A.public_key), Rejection.BAD_SIGNATURE),
        (lambda: signed(A, 1, network="elsewhere"), Rejection.WRONG_NETWORK),
        (lambda: Envelope.sign(A, AGENTS_DOMAIN, b"\x93\x01\x02"), Rejection.MALFORMED),
        (lambda: Envelope.sign(A, "symphony/ledger/agents/v9", encode(cards_record(A))),
         Rejection.UNKNOWN_VERSION),
        (lambda: Envelope.sign(A, AGENTS_DOMAIN, bytes(MAX_AGENT_CARDS_BYTES + 1)),
         Rejection.OVERSIZED),
        # one agent past the per-node limit: the record's item limit
        (lambda: signed(A, 1, cards=tuple(card(f"a{i}") for i in range(MAX_AGENTS_PER_NODE + 1))),
         Rejection.MALFORMED),
        (lambda: signed(A, 1, issued=T0 + 10 * MINUTE), Rejection.FROM_FUTURE),
    ],
)
def test_bad_records_are_refused_and_cost_the_sender(make: object, reason: Rejection) -> None:
    m = machine(0)
    effects = m.handle(Received(SENDER, push(make()), "ledger"), T0)  # type: ignore[operator]
    assert not [e for e in effects if isinstance(e, StoreAgentCards)]
    assert penalties(effects) == {f"ledger:{reason.value}": PENALTY_POINTS[reason]}
    assert m.rejections()[SENDER] == {reason.value: 1}
    assert m.view.agent_records(T0) == []


def test_gossip_counts_cards_among_its_items() -> None:
    m = machine(0, LedgerConfig(max_gossip_items=2))
    effects = m.handle(Received(SENDER, push(*(signed(identity(i)) for i in (1, 2, 3))),
                                "ledger"), T0)
    assert penalties(effects) == {"ledger:oversized": PENALTY_POINTS[Rejection.OVERSIZED]}
    assert m.view.agent_records(T0) == []


def test_refused_after_intake_is_dropped_penalized_and_not_taken_back() -> None:
    net = Net()
    a, b, c = (net.add(machine(i)) for i in (1, 2, 3))
    net.connect(a.peer_id, b.peer_id)
    net.feed(a.peer_id, SetAgents((card(),)))
    net.run()
    held = b.state.cards.held[a.peer_id]
    effects = b.handle(RefuseAgentCards(a.peer_id, held.hash), net.now)
    assert ForgetAgentCards((a.peer_id,)) in effects
    assert penalties(effects) == {"ledger:vector_mismatch": 20}  # the author pays
    assert [e.peer for e in effects if isinstance(e, Penalize)] == [a.peer_id]
    assert b.view.agents(a.peer_id) is None
    assert b.handle(RefuseAgentCards(a.peer_id, held.hash), net.now) == []  # once
    # the same bytes again (gossip from anyone, or a sync) are neither merged nor penalized
    again = b.handle(Received(SENDER, push(held.envelope), "ledger"), net.now)
    assert again == [] and b.view.agents(a.peer_id) is None
    net.connect(a.peer_id, c.peer_id)  # c holds them; b does not pull them from c
    net.connect(b.peer_id, c.peer_id)
    net.run()
    assert c.view.agents(a.peer_id) is not None and b.view.agents(a.peer_id) is None
    assert a.peer_id not in b.sync.wanted_agents(c.state.digest(net.now))
    assert b.rejections() == {a.peer_id: {"vector_mismatch": 1}}  # c was not blamed
    # a newer record of a's is taken
    net.now += 5_000
    net.feed(a.peer_id, SetAgents((card(), GENERALIST)))
    net.run()
    newer = b.view.agents(a.peer_id)
    assert newer is not None and len(newer.cards) == 2


def test_restore_reverifies_cards_and_moves_own_seq_forward() -> None:
    m = machine(1)  # identity(1) == A
    m.handle(SetAgents((card(),)), T0)
    m.handle(Received(SENDER, push(signed(B, 1, ttl=MINUTE), signed(C, 1)), "ledger"), T0)
    stored = [h.envelope.encode() for _, h in sorted(m.state.cards.held.items())]
    later = T0 + 2 * MINUTE
    fresh = machine(1)
    report = fresh.restore([], [], later, agents=[*stored, b"junk"])
    assert report.agents == 2 and len(report.stale_agents) == 2  # B's expired, and the junk
    assert fresh.view.agents(C.peer_id, later) is not None
    own_seq = m.state.cards.held[A.peer_id].record.seq
    (store,) = [e for e in fresh.handle(SetAgents((card(),)), later)
                if isinstance(e, StoreAgentCards)]
    assert store.record.seq > own_seq


def test_own_cards_from_a_previous_life_are_overtaken() -> None:
    m = machine(1)
    m.handle(Received(SENDER, push(signed(A, T0 + 10_000)), "ledger"), T0)
    (store,) = [e for e in m.handle(SetAgents((card(),)), T0 + 1)
                if isinstance(e, StoreAgentCards)]
    assert store.record.seq > T0 + 10_000
    assert isinstance(store.record, AgentCards)
