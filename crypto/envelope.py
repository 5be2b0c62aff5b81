"""Signed envelopes: everything a node asserts to others travels in one.

An envelope is ``(public_key, domain, payload, signature)``. The signature covers

    SIGNING_CONTEXT || u16_be(len(domain)) || domain (utf-8) || payload

so a signature made for one domain (say ``symphony/ledger/v1``) never verifies in another,
and the payload bytes are signed exactly as received: nothing is re-encoded before checking.

On the wire an envelope is the msgpack array ``[public_key: bin 32, domain: str, payload: bin,
signature: bin 64]``; ``encode`` is the one canonical encoder and golden-byte tests pin it.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from crypto.hashing import digest
from crypto.keys import PUBLIC_KEY_LEN, SIGNATURE_LEN, Identity, verify_signature
from crypto.peer_id import peer_id_from_public_key
from crypto.unpack import Undecodable, unpack_bounded

SIGNING_CONTEXT = b"symphony-envelope/v1\x00"
MAX_DOMAIN_LEN = 64
#: the largest payload an envelope may carry; protocols set their own, smaller limits.
MAX_PAYLOAD_LEN = 4 * 1024 * 1024
_MAX_ENCODED_LEN = MAX_PAYLOAD_LEN + 256


class EnvelopeError(ValueError):
    """An envelope is malformed, or its signature, domain or signer does not check out."""


def _signed_bytes(domain: str, payload: bytes) -> bytes:
    d = domain.encode("utf-8")
    return SIGNING_CONTEXT + len(d).to_bytes(2, "big") + d + payload


def _check_domain(domain: str) -> None:
    if not domain or len(domain.encode("utf-8")) > MAX_DOMAIN_LEN:
        raise EnvelopeError(f"domain must be 1..{MAX_DOMAIN_LEN} bytes, got {domain!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    public_key: bytes
    domain: str
    payload: bytes
    signature: bytes

    @classmethod
    def sign(cls, identity: Identity, domain: str, payload: bytes) -> Envelope:
        _check_domain(domain)
        if len(payload) > MAX_PAYLOAD_LEN:
            raise EnvelopeError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_LEN}")
        return cls(
            public_key=identity.public_key,
            domain=domain,
            payload=payload,
            signature=identity.sign(_signed_bytes(domain, payload)),
        )

    @property
    def signer(self) -> str:
        """The signer's libp2p peer id."""
        return peer_id_from_public_key(self.public_key)

    def encode(self) -> bytes:
        data: bytes = msgpack.packb(
            [self.public_key, self.domain, self.payload, self.signature], use_bin_type=True
        )
        return data

    def to_wire(self) -> tuple[bytes, str, bytes, bytes]:
        """The envelope as a tuple, for nesting inside a larger message."""
        return (self.public_key, self.domain, self.payload, self.signature)

    @classmethod
    def from_wire(cls, value: object) -> Envelope:
        """Build from the decoded array form, checking every type and length."""
        if not isinstance(value, (list, tuple)) or len(value) != 4:
            raise EnvelopeError("envelope must be an array of 4 items")
        public_key, domain, payload, signature = value
        if type(public_key) is not bytes or len(public_key) != PUBLIC_KEY_LEN:
            raise EnvelopeError("envelope public key must be 32 bytes")
        if type(domain) is not str:
            raise EnvelopeError("envelope domain must be a string")
        _check_domain(domain)
        if type(payload) is not bytes or len(payload) > MAX_PAYLOAD_LEN:
            raise EnvelopeError(f"envelope payload must be bytes of at most {MAX_PAYLOAD_LEN}")
        if type(signature) is not bytes or len(signature) != SIGNATURE_LEN:
            raise EnvelopeError("envelope signature must be 64 bytes")
        return cls(public_key=public_key, domain=domain, payload=payload, signature=signature)

    @classmethod
    def decode(cls, data: bytes) -> Envelope:
        if len(data) > _MAX_ENCODED_LEN:
            raise EnvelopeError(f"envelope of {len(data)} bytes exceeds {_MAX_ENCODED_LEN}")
        try:
            value = unpack_bounded(data, max_str=MAX_DOMAIN_LEN, max_bin=MAX_PAYLOAD_LEN,
                                   max_array=4)
        except Undecodable as exc:
            raise EnvelopeError(f"envelope is not valid msgpack: {exc}") from None
        return cls.from_wire(value)

    def verify(self, domain: str, *, signer: bytes | None = None) -> bytes:
        """Return the payload iff the signature is valid for ``domain`` (and ``signer``)."""
        if self.domain != domain:
            raise EnvelopeError(f"envelope domain {self.domain!r} is not {domain!r}")
        if signer is not None and signer != self.public_key:
            raise EnvelopeError("envelope is signed by another key than expected")
        if not verify_signature(
            self.public_key, _signed_bytes(self.domain, self.payload), self.signature
        ):
            raise EnvelopeError(f"bad signature on {domain} envelope from {self.signer}")
        return self.payload

    @property
    def content_hash(self) -> bytes:
        """Identifies the envelope (Ed25519 signatures are deterministic, so this is stable)."""
        return digest(self.encode(), person=b"symphony-env")
