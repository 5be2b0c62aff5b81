"""Agent cards: the canonical bytes, the round trip, and every refusal of a received record."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.envelope import Envelope
from protocol.agents.cards import (
    AGENTS_DOMAIN,
    MAX_AGENT_CARDS_BYTES,
    MAX_AGENTS_PER_NODE,
    MAX_DESCRIPTION_LEN,
    MAX_EMBEDDING_DIM,
    MAX_SKILL_LEN,
    MAX_SKILLS,
    MAX_TOOL_DESCRIPTION_LEN,
    MAX_TOOL_NAME_LEN,
    MAX_TOOLS,
    AgentCard,
    AgentCards,
    AgentTool,
    open_agent_cards,
    seal_agent_cards,
    supersedes,
)
from protocol.agents.matching import dequantize
from protocol.codec import decode, encode
from protocol.errors import InvalidMessage
from protocol.ledger.records import PENALTY_POINTS, Rejected, Rejection
from tests.protocol.agent_fixtures import (
    EMBEDDER,
    HOUR,
    MINUTE,
    NET,
    T0,
    card,
    cards_record,
    identity,
    signed,
)

A, B = identity(1), identity(2)
NOW = T0 + MINUTE


def test_golden_bytes_of_a_card() -> None:
    # [181, 1, "c", "d", ["math"], nil, nil, [[180, 1, "t", "", false]], 0.5, b"\x7f\x81",
    #  1/127 (the scale of [1.0, -1.0]), b"\x00" * 32]
    c = AgentCard(
        name="c", description="d", skills=("math",), model=None, adapter=None,
        tools=(AgentTool(name="t", description="", side_effects=False),),
        price_per_1k_tokens=0.5, embedding=b"\x7f\x81", embedding_scale=1 / 127,
        embedder_hash=bytes(32),
    )
    assert encode(c).hex() == (
        "9cccb501a163a16491a46d617468c0c09195ccb401a174a0c2cb3fe0000000000000"
        "c4027f81cb3f80204081020408c420" + "00" * 32
    )
    assert decode(encode(c), AgentCard) == c


def test_a_signed_record_round_trips_and_opens() -> None:
    record = cards_record(A, 3, cards=(card("calc"), card("writer", skills=("writing",),
                                                          model="smollm2-135m", adapter="lora-1")))
    env = seal_agent_cards(A, record)
    assert Envelope.decode(env.encode()) == env
    opened = open_agent_cards(env, NET, NOW)
    assert opened == record
    assert opened.card("writer") is not None and opened.card("nobody") is None
    got = opened.cards[0].vector(EMBEDDER)
    assert got is not None and got == pytest.approx([0.6, -0.8, 0.0], abs=0.01)
    assert opened.cards[0].vector(bytes(32)) is None, "another embedder's vector is not comparable"


def test_a_newer_sequence_of_the_same_node_supersedes() -> None:
    old, new = cards_record(A, 1), cards_record(A, 2, cards=())
    assert supersedes(new, old) and not supersedes(old, new) and not supersedes(old, old)
    assert not supersedes(cards_record(B, 9), old)


def test_a_record_at_every_limit_fits_the_byte_limit() -> None:
    tool = AgentTool(name="t" * MAX_TOOL_NAME_LEN, description="x" * MAX_TOOL_DESCRIPTION_LEN,
                     side_effects=True)
    full = [
        card(
            f"agent-{i}",
            description="d" * MAX_DESCRIPTION_LEN,
            skills=tuple(f"{j}" * MAX_SKILL_LEN for j in range(MAX_SKILLS)),
            model="m" * 128, adapter="a" * 128,
            tools=tuple(dataclasses.replace(tool, name=f"{j}" + tool.name[1:])
                        for j in range(MAX_TOOLS)),
            embedding=b"\x01" * MAX_EMBEDDING_DIM, embedding_scale=0.01,
        )
        for i in range(MAX_AGENTS_PER_NODE)
    ]
    record = cards_record(A, cards=tuple(full))
    assert len(encode(record)) <= MAX_AGENT_CARDS_BYTES
    assert open_agent_cards(seal_agent_cards(A, record), NET, NOW) == record


def _wide_cards() -> tuple[AgentCard, ...]:
    """Cards within every item limit whose text takes three bytes a character: together more
    bytes than one record may carry."""
    wide = "\u4e00" * MAX_TOOL_DESCRIPTION_LEN
    tools = tuple(AgentTool(name=f"t{j}", description=wide, side_effects=False)
                  for j in range(MAX_TOOLS))
    return tuple(card(f"a{i}", description="\u4e00" * MAX_DESCRIPTION_LEN, tools=tools,
                      embedding=b"\x01" * MAX_EMBEDDING_DIM)
                 for i in range(MAX_AGENTS_PER_NODE))


def _forged(env: Envelope) -> Envelope:
    return dataclasses.replace(env, signature=bytes([env.signature[0] ^ 1]) + env.signature[1:])


def _retyped(env: Envelope, index: int, value: object) -> Envelope:
    """The record re-signed by its signer with one card field replaced by ``value``."""
    items = list(msgpack.unpackb(env.payload, raw=False, use_list=True))
    items[7][0][index] = value
    return Envelope.sign(A, AGENTS_DOMAIN, msgpack.packb(items, use_bin_type=True))


CASES: list[tuple[str, object, Rejection]] = [
    ("forged signature", lambda: _forged(signed(A)), Rejection.BAD_SIGNATURE),
    ("signed by another node", lambda: signed(B, peer_id=A.peer_id), Rejection.SIGNER_NOT_SUBJECT),
    ("another network", lambda: signed(A, network="othernet"), Rejection.WRONG_NETWORK),
    ("oversized", lambda: Envelope.sign(A, AGENTS_DOMAIN, bytes(MAX_AGENT_CARDS_BYTES + 1)),
     Rejection.OVERSIZED),
    ("over the byte limit within item limits", lambda: signed(A, cards=_wide_cards()),
     Rejection.OVERSIZED),
    ("capability domain", lambda: Envelope.sign(A, "symphony/ledger/capability/v1",
                                                signed(A).payload), Rejection.WRONG_DOMAIN),
    ("unknown domain version", lambda: Envelope.sign(A, "symphony/ledger/agents/v2",
                                                     signed(A).payload), Rejection.UNKNOWN_VERSION),
    ("too many agents", lambda: signed(A, cards=tuple(card(f"a{i}") for i in
                                                      range(MAX_AGENTS_PER_NODE + 1))),
     Rejection.MALFORMED),
    ("too many tools", lambda: signed(A, cards=(card(tools=tuple(
        AgentTool(name=f"t{i}", description="", side_effects=False)
        for i in range(MAX_TOOLS + 1))),)), Rejection.MALFORMED),
    ("too many skills", lambda: signed(A, cards=(card(skills=tuple(
        f"s{i}" for i in range(MAX_SKILLS + 1))),)), Rejection.MALFORMED),
    ("description too long", lambda: signed(A, cards=(card(
        description="x" * (MAX_DESCRIPTION_LEN + 1)),)), Rejection.MALFORMED),
    ("embedding too long", lambda: signed(A, cards=(card(
        embedding=bytes(MAX_EMBEDDING_DIM + 1)),)), Rejection.MALFORMED),
    ("agent names repeat", lambda: signed(A, cards=(card("x"), card("x"))), Rejection.MALFORMED),
    ("tool names repeat", lambda: signed(A, cards=(card(tools=(
        AgentTool(name="t", description="", side_effects=False),) * 2),)), Rejection.MALFORMED),
    ("skill not normalized", lambda: signed(A, cards=(card(skills=("Math",)),)),
     Rejection.MALFORMED),
    ("name with a space", lambda: signed(A, cards=(card("my agent"),)), Rejection.MALFORMED),
    ("embedding without embedder hash", lambda: signed(A, cards=(card(embedder_hash=b""),)),
     Rejection.MALFORMED),
    ("embedding with zero scale", lambda: signed(A, cards=(card(embedding_scale=0.0),)),
     Rejection.MALFORMED),
    ("side effects as an int", lambda: _retyped(signed(A), 7, [[180, 1, "t", "", 1]]),
     Rejection.MALFORMED),
    ("price as a string", lambda: _retyped(signed(A), 8, "0.5"), Rejection.MALFORMED),
    ("skills as a string", lambda: _retyped(signed(A), 4, "math"), Rejection.MALFORMED),
    ("negative price", lambda: _retyped(signed(A), 8, -1.0), Rejection.MALFORMED),
    ("from the future", lambda: signed(A, issued=NOW + 2 * MINUTE), Rejection.FROM_FUTURE),
    ("expiry too far", lambda: signed(A, issued=NOW, ttl=2 * HOUR), Rejection.EXPIRY_TOO_FAR),
    ("expired", lambda: signed(A, issued=NOW - 40 * MINUTE), Rejection.EXPIRED),
]


@pytest.mark.parametrize("make, reason", [(m, r) for _, m, r in CASES],
                         ids=[name for name, _, _ in CASES])
def test_every_bad_record_is_refused_with_its_reason(make: object, reason: Rejection) -> None:
    env = make()  # type: ignore[operator]
    with pytest.raises(Rejected) as info:
        open_agent_cards(env, NET, NOW)
    assert info.value.reason is reason, info.value
    assert PENALTY_POINTS[reason] > 0 or reason is Rejection.EXPIRED


def test_seal_refuses_what_peers_would_refuse() -> None:
    with pytest.raises(ValueError, match="signed by"):
        seal_agent_cards(A, cards_record(B))
    with pytest.raises(ValueError, match="exceed"):
        seal_agent_cards(A, cards_record(A, cards=_wide_cards()))


def test_the_constructor_of_a_card_does_not_check_but_decode_does() -> None:
    bad = card(skills=("Bad Tag",))
    with pytest.raises(InvalidMessage, match="normalized tag"):
        decode(encode(bad), AgentCard)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.binary(max_size=600))
def test_the_opener_raises_only_rejected_on_arbitrary_payloads(payload: bytes) -> None:
    for domain in (AGENTS_DOMAIN, "symphony/ledger/agents/v9"):
        try:
            open_agent_cards(Envelope.sign(A, domain, payload), NET, NOW)
        except Rejected:
            pass


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.data())
def test_the_opener_raises_only_rejected_on_mutated_records(data: st.DataObject) -> None:
    payload = bytearray(signed(A).payload)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(payload) - 1))
        payload[at] = data.draw(st.integers(0, 255))
    try:
        record = open_agent_cards(Envelope.sign(A, AGENTS_DOMAIN, bytes(payload)), NET, NOW)
    except Rejected:
        return
    assert isinstance(record, AgentCards)
    assert decode(encode(record), AgentCards) == record


def test_dequantized_vectors_of_the_fixture_are_what_the_card_says() -> None:
    c = card(vector=(1.0, -0.5, 0.25))
    assert dequantize(c.embedding, c.embedding_scale) == pytest.approx([1.0, -0.5, 0.25],
                                                                       abs=0.005)
