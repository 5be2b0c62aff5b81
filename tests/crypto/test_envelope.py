from __future__ import annotations

import msgpack
import pytest

from crypto.envelope import MAX_PAYLOAD_LEN, Envelope, EnvelopeError
from crypto.keys import Identity

ALICE = Identity.from_seed(b"\x01" * 32)
MALLORY = Identity.from_seed(b"\x02" * 32)
DOMAIN = "symphony/test/v1"


def test_golden_bytes() -> None:
    env = Envelope.sign(ALICE, DOMAIN, b"hello")
    # Ed25519 is deterministic, so the whole encoding is pinned.
    assert env.encode().hex() == GOLDEN
    assert Envelope.decode(bytes.fromhex(GOLDEN)) == env
    assert env.verify(DOMAIN) == b"hello"
    assert env.signer == ALICE.peer_id


# [pubkey bin32, "symphony/test/v1", b"hello", signature bin64] as msgpack
GOLDEN = (
    "94c4208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5cb073796d70686f6e792f"
    "746573742f7631c40568656c6c6fc4408a359612bdeb32a7da5b564151df38d0016d5891c5334c6804cef9ed79"
    "865cc11ecf115eee66cf896d0d2d1e0e415cc62d58e599d118f0841f83ab7efb1d680c"
)


def _flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


def test_every_single_byte_tamper_fails() -> None:
    env = Envelope.sign(ALICE, DOMAIN, b"payload bytes")
    wire = env.encode()
    for i in range(len(wire)):
        tampered = _flip(wire, i)
        try:
            decoded = Envelope.decode(tampered)
            decoded.verify(DOMAIN, signer=ALICE.public_key)
        except EnvelopeError:
            continue
        pytest.fail(f"flipping byte {i} went unnoticed")


@pytest.mark.parametrize(
    "case",
    ["wrong_domain", "wrong_signer", "swapped_key", "swapped_payload", "swapped_signature"],
)
def test_tamper_matrix(case: str) -> None:
    env = Envelope.sign(ALICE, DOMAIN, b"data")
    other = Envelope.sign(MALLORY, DOMAIN, b"evil")
    with pytest.raises(EnvelopeError):
        if case == "wrong_domain":
            env.verify("symphony/other/v1")
        elif case == "wrong_signer":
            env.verify(DOMAIN, signer=MALLORY.public_key)
        elif case == "swapped_key":
            Envelope(public_key=MALLORY.public_key, domain=DOMAIN, payload=env.payload,
                     signature=env.signature).verify(DOMAIN)
        elif case == "swapped_payload":
            Envelope(public_key=env.public_key, domain=DOMAIN, payload=other.payload,
                     signature=env.signature).verify(DOMAIN)
        else:
            Envelope(public_key=env.public_key, domain=DOMAIN, payload=env.payload,
                     signature=other.signature).verify(DOMAIN)


def test_domain_separation_same_payload() -> None:
    a = Envelope.sign(ALICE, "symphony/a/v1", b"x")
    forged = Envelope(public_key=a.public_key, domain="symphony/b/v1", payload=b"x",
                      signature=a.signature)
    with pytest.raises(EnvelopeError, match="bad signature"):
        forged.verify("symphony/b/v1")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",
        msgpack.packb([b"k" * 32, "d", b"p"]),
        msgpack.packb([b"k" * 31, "d", b"p", b"s" * 64]),
        msgpack.packb([b"k" * 32, "", b"p", b"s" * 64]),
        msgpack.packb([b"k" * 32, "d", "p", b"s" * 64]),
        msgpack.packb([b"k" * 32, "d", b"p", b"s" * 63]),
        msgpack.packb({"a": 1}),
        msgpack.packb([b"k" * 32, "d" * 65, b"p", b"s" * 64]),
    ],
)
def test_malformed_envelopes(raw: bytes) -> None:
    with pytest.raises(EnvelopeError):
        Envelope.decode(raw)


def test_payload_limit() -> None:
    with pytest.raises(EnvelopeError, match="exceeds"):
        Envelope.sign(ALICE, DOMAIN, b"x" * (MAX_PAYLOAD_LEN + 1))
