"""libp2p peer ids for Ed25519 keys, computed without libp2p.

A libp2p peer id is a multihash of the protobuf-encoded public key. For Ed25519 the encoding
(``08 01 12 20 <32-byte key>``, 36 bytes) is short enough for the *identity* multihash
(``00 24 <36 bytes>``), so the peer id contains the public key itself: anyone can recover the
key from the id and check a signature against it. Rendered in base58btc it starts "12D3KooW".
"""

from __future__ import annotations

from crypto.base58 import b58decode, b58encode

_PROTOBUF_ED25519_PREFIX = bytes([0x08, 0x01, 0x12, 0x20])  # KeyType=Ed25519, Data: 32 bytes
_IDENTITY_MULTIHASH_PREFIX = bytes([0x00, 0x24])  # identity hash, 36 bytes
_PREFIX = _IDENTITY_MULTIHASH_PREFIX + _PROTOBUF_ED25519_PREFIX


class InvalidPeerId(ValueError):
    """A string is not an Ed25519 libp2p peer id."""


def peer_id_from_public_key(public_key: bytes) -> str:
    if len(public_key) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(public_key)}")
    return b58encode(_PREFIX + public_key)


def public_key_from_peer_id(peer_id: str) -> bytes:
    """The Ed25519 public key inside ``peer_id``; raises InvalidPeerId otherwise."""
    try:
        raw = b58decode(peer_id)
    except ValueError as exc:
        raise InvalidPeerId(f"peer id {peer_id!r} is not base58: {exc}") from None
    if len(raw) != len(_PREFIX) + 32 or not raw.startswith(_PREFIX):
        raise InvalidPeerId(f"peer id {peer_id!r} is not an Ed25519 identity-multihash id")
    return raw[len(_PREFIX):]
