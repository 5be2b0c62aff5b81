"""The signed relay manifest and the chunk-stream messages: signing, checks, golden bytes."""

from __future__ import annotations

import dataclasses

import pytest

from crypto.envelope import Envelope
from crypto.hashing import digest
from crypto.keys import Identity
from protocol.codec import decode, encode
from protocol.errors import InvalidMessage
from protocol.relay.manifest import (
    MANIFEST_DOMAIN,
    MAX_CHUNKS,
    MAX_RECIPIENTS,
    ArtifactFormat,
    ChunkHeader,
    ChunkRequest,
    ChunkStatus,
    ManifestBody,
    ManifestError,
    Recipient,
    RelayManifest,
    chunk_count,
    chunk_hash,
    make_body,
    sign_manifest,
    verify_manifest,
)

PUBLISHER = Identity.from_seed(b"\x01" * 32)
OTHER = Identity.from_seed(b"\x02" * 32)
CHUNK = 4096


def chunks_of(data: bytes, size: int = CHUNK) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


DATA = bytes(range(256)) * 41  # 10496 bytes: 3 chunks, the last one short


def body(**overrides: object) -> ManifestBody:
    b = make_body(
        name="smollm2",
        version=3,
        chunk_size=CHUNK,
        chunk_hashes=[chunk_hash(c) for c in chunks_of(DATA)],
        total_size=len(DATA),
        format=ArtifactFormat.GGUF,
        base_version=2,
        publisher_upload_bps=1000,
        recipients=[(OTHER.peer_id, 500)],
    )
    return dataclasses.replace(b, **overrides)  # type: ignore[arg-type]


def test_sign_verify_round_trip_through_the_wire() -> None:
    m = sign_manifest(PUBLISHER, body())
    wire = encode(m.message)
    again = verify_manifest(decode(wire, RelayManifest))
    assert again.id == m.id and again.signer == PUBLISHER.peer_id
    assert again.body == body()
    assert again.key == (PUBLISHER.peer_id, "smollm2")
    assert again.chunks == 3
    assert [again.chunk_span(i) for i in range(3)] == [(0, 4096), (4096, 4096), (8192, 2304)]
    with pytest.raises(IndexError):
        again.chunk_span(3)


def test_golden_bytes_of_a_manifest_body() -> None:
    # The signed bytes come from the one canonical encoder; this pins them:
    # [90, 1, "a", 1, 1, 4096, [h], h (root of one leaf is the leaf), "raw", nil, 0, [[92, 1, "p", 7]]]
    b = make_body(
        name="a",
        version=1,
        chunk_size=4096,
        chunk_hashes=[chunk_hash(b"x")],
        total_size=1,
        recipients=[("p", 7)],
    )
    h = "0541a39099382c97cd844d9e49a7e050b1562b7512d2b655efade4e594637f23"
    assert encode(b).hex() == (
        "9c5a01a1610101cd100091c420" + h + "c420" + h + "a3726177c00091945c01a17007"
    )


@pytest.mark.parametrize(
    "overrides, error",
    [
        ({"total_size": len(DATA) + CHUNK}, "chunk hashes"),
        ({"merkle_root": b"\0" * 32}, "merkle root"),
        ({"base_version": 3}, "base version"),
        ({"name": ""}, "empty"),
        ({"chunk_size": 1024}, "outside"),
    ],
)
def test_bad_bodies_are_refused_by_signer_and_receiver(overrides: dict, error: str) -> None:
    bad = body(**overrides)
    with pytest.raises(InvalidMessage, match=error):
        decode(encode(bad), ManifestBody)
    # a receiver never trusts the signer to have checked
    env = Envelope.sign(PUBLISHER, MANIFEST_DOMAIN, encode(bad))
    with pytest.raises(ManifestError):
        verify_manifest(RelayManifest(envelope=env))


def test_sign_refuses_a_bad_body() -> None:
    with pytest.raises(ManifestError, match="merkle"):
        sign_manifest(PUBLISHER, body(merkle_root=b"\1" * 32))


def test_duplicate_recipient_is_refused() -> None:
    b = make_body(
        name="x",
        version=1,
        chunk_size=CHUNK,
        chunk_hashes=[chunk_hash(b"a")],
        total_size=1,
        recipients=[("p", 1), ("p", 2)],
    )
    with pytest.raises(InvalidMessage, match="twice"):
        decode(encode(b), ManifestBody)


def test_tampered_or_misdomained_envelopes_fail() -> None:
    m = sign_manifest(PUBLISHER, body())
    env = m.message.envelope
    payload = bytearray(env.payload)
    payload[-1] ^= 1
    tampered = dataclasses.replace(env, payload=bytes(payload))
    with pytest.raises(ManifestError, match="bad signature"):
        verify_manifest(RelayManifest(envelope=tampered))
    # another key cannot pose as the publisher
    forged = dataclasses.replace(env, public_key=OTHER.public_key)
    with pytest.raises(ManifestError):
        verify_manifest(RelayManifest(envelope=forged))
    wrong_domain = Envelope.sign(PUBLISHER, "symphony/ledger/v1", env.payload)
    with pytest.raises(ManifestError, match="domain"):
        verify_manifest(RelayManifest(envelope=wrong_domain))
    not_a_body = Envelope.sign(
        PUBLISHER, MANIFEST_DOMAIN, encode(ChunkRequest(manifest_id=b"\0" * 32, index=0))
    )
    with pytest.raises(ManifestError, match="expected a ManifestBody"):
        verify_manifest(RelayManifest(envelope=not_a_body))


def test_largest_manifest_fits_a_gossip_message() -> None:
    n = MAX_CHUNKS
    # MAX_RECIPIENTS peer ids of the real length (52 characters), each distinct
    recipients = [(PUBLISHER.peer_id[:-8] + f"{i:08d}", 1 << 30) for i in range(MAX_RECIPIENTS)]
    b = make_body(
        name="m" * 64,
        version=1,
        chunk_size=CHUNK,
        total_size=n * CHUNK,
        chunk_hashes=[digest(i.to_bytes(4, "big")) for i in range(n)],
        recipients=recipients,
    )
    m = sign_manifest(PUBLISHER, b)
    assert len(encode(m.message)) < 960 * 1024  # the gossip message cap is 1 MiB - 16 KiB
    too_many = dataclasses.replace(b, chunk_hashes=b.chunk_hashes + (b"\0" * 32,))
    with pytest.raises(InvalidMessage, match="exceed"):
        decode(encode(too_many), ManifestBody)
    one_more = dataclasses.replace(
        b, recipients=(*b.recipients, Recipient(peer_id="extra", upload_bps=1))
    )
    with pytest.raises(InvalidMessage, match="recipients.*exceed"):
        decode(encode(one_more), ManifestBody)


def test_chunk_messages_round_trip_and_limits() -> None:
    req = ChunkRequest(manifest_id=b"\7" * 32, index=5)
    assert decode(encode(req), ChunkRequest) == req
    hdr = ChunkHeader(manifest_id=b"\7" * 32, index=5, status=ChunkStatus.BUSY, size=0)
    assert decode(encode(hdr), ChunkHeader) == hdr
    with pytest.raises(InvalidMessage):
        decode(encode(ChunkRequest(manifest_id=b"\7" * 32, index=MAX_CHUNKS)), ChunkRequest)
    with pytest.raises(InvalidMessage):
        decode(encode(ChunkRequest(manifest_id=b"\7" * 31, index=0)), ChunkRequest)


def test_chunk_count() -> None:
    assert chunk_count(1, CHUNK) == 1
    assert chunk_count(CHUNK, CHUNK) == 1
    assert chunk_count(CHUNK + 1, CHUNK) == 2
