"""Hashing: BLAKE2b with a 32-byte digest, everywhere.

One choice for the whole project: BLAKE2b-256 (``hashlib.blake2b(digest_size=32)``). It is in
the standard library, faster than SHA-256 in pure CPython on x86-64 without SHA extensions,
and its 32-byte digest matches the Ed25519 key size, so every id, commitment and Merkle node
is 32 bytes. Domain separation comes from the ``person`` parameter (up to 16 bytes), so a
leaf hash can never be confused with an inner-node hash or a commitment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

HASH_LEN = 32


def digest(data: bytes, *, person: bytes = b"") -> bytes:
    """BLAKE2b-256 of ``data``, personalised with ``person`` (<= 16 bytes)."""
    return hashlib.blake2b(data, digest_size=HASH_LEN, person=person).digest()


def digest_parts(parts: Iterable[bytes], *, person: bytes = b"") -> bytes:
    """Hash a sequence of byte strings unambiguously: each part is length-prefixed."""
    h = hashlib.blake2b(digest_size=HASH_LEN, person=person)
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


def hexdigest(data: bytes, *, person: bytes = b"") -> str:
    return digest(data, person=person).hex()
