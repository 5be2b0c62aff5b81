"""Every wire decoder under fuzzing: whatever the bytes, the one documented error or a value.

For each registered message class (every message module's), drawn within its declared limits:
a constructed message round-trips exactly, and a refusal is the class's own ``check``; and
hostile variants of its frame (byte and structural mutations, see tests/protocol/fuzzing.py)
raise ``InvalidMessage`` or decode to a message that re-encodes stably, never anything else.
The other decoders of peer bytes (signed envelopes, Merkle proofs, packed token ids, the
ledger's tag peek) get the same treatment. Deterministic: ``derandomize=True``.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crypto.envelope import Envelope, EnvelopeError
from protocol.codec import Message, decode, encode, peek_tag_version
from protocol.envelopes import open_envelope
from protocol.errors import InvalidMessage
from protocol.verification.rules import decode_proof, unpack_ids
from tests.protocol.fuzzing import SIGNERS, Unbuilt, all_message_classes, frame_of, mutate

CLASSES = all_message_classes()
FUZZ = settings(max_examples=15, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_every_message_module_is_fuzzed() -> None:
    modules = {cls.__module__ for cls in CLASSES}
    assert modules == {
        "protocol.agents.cards", "protocol.agents.plans", "protocol.agents.wire", "protocol.inference.messages", "protocol.ledger.messages", "protocol.ledger.records",
        "protocol.market.messages", "protocol.market.progress",
        "protocol.membership.discovery_messages", "protocol.membership.messages",
        "protocol.relay.manifest", "protocol.rl.messages",
        "protocol.verification.messages"}
    assert len(CLASSES) >= 40


def _refused_by_own_check(value: object) -> bool:
    """Whether ``value`` or a message nested in it fails its class's ``check``."""
    if isinstance(value, tuple):
        return any(_refused_by_own_check(v) for v in value)
    if not isinstance(value, Message) or isinstance(value, Unbuilt):
        return isinstance(value, Unbuilt)
    if any(_refused_by_own_check(getattr(value, f.name)) for f in dataclasses.fields(value)):  # type: ignore[arg-type]
        return True
    check = getattr(value, "check", None)
    try:
        if check is not None:
            check()
    except ValueError:
        return True
    return False


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@FUZZ
@given(data=st.data())
def test_well_typed_messages_round_trip_or_are_refused_by_their_own_rule(
        cls: type[Message], data: st.DataObject) -> None:
    from tests.protocol.fuzzing import messages_of

    msg = data.draw(messages_of(cls))
    frame = frame_of(msg)
    try:
        back = decode(frame, cls)
    except InvalidMessage:
        assert isinstance(msg, Unbuilt) or _refused_by_own_check(msg), \
            f"a {cls.__name__} within its declared limits was refused"
        return
    assert not isinstance(msg, Unbuilt), f"{cls.__name__}'s constructor refused what decode took"
    assert back == msg
    assert encode(back) == frame


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@FUZZ
@given(data=st.data())
def test_mutated_frames_raise_invalid_message_or_decode_stably(
        cls: type[Message], data: st.DataObject) -> None:
    from tests.protocol.fuzzing import messages_of

    frame = mutate(data, frame_of(data.draw(messages_of(cls))))
    for expect in (cls, Message):
        try:
            msg = decode(frame, expect)
        except InvalidMessage:
            continue
        assert decode(encode(msg), expect) == msg


@FUZZ
@given(data=st.data())
def test_envelopes_raise_envelope_error_only(data: st.DataObject) -> None:
    env = Envelope.sign(data.draw(st.sampled_from(SIGNERS)), "symphony/test/v1",
                        data.draw(st.binary(max_size=100)))
    frame = mutate(data, env.encode())
    try:
        decoded = Envelope.decode(frame)
    except EnvelopeError:
        return
    try:
        decoded.verify("symphony/test/v1")
    except EnvelopeError:
        pass
    try:
        open_envelope(decoded, "symphony/test/v1", Message, 1 << 20)  # type: ignore[type-abstract]
    except InvalidMessage:
        pass


@FUZZ
@given(st.binary(max_size=200))
def test_proofs_and_token_ids_raise_value_error_only(data: bytes) -> None:
    for parse in (decode_proof, unpack_ids):
        try:
            parse(data)
        except ValueError:
            pass
    peeked = peek_tag_version(data)
    assert peeked is None or all(type(x) is int for x in peeked)
