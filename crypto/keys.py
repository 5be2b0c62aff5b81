"""Ed25519 node identity: one key signs ledger records and authenticates the libp2p transport.

The private key file is PKCS#8 PEM, written with mode 0600 through a temporary file and an
atomic rename, so a kill mid-write never leaves half a key. Loading refuses a key file that
its group or others can read (as ssh does): a leaked key is a stolen identity.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from crypto.peer_id import peer_id_from_public_key

PUBLIC_KEY_LEN = 32
SIGNATURE_LEN = 64
KEY_FILE_MODE = 0o600


class KeyFileError(Exception):
    """A key file is missing, unreadable, malformed or too widely readable."""


@dataclass(frozen=True, slots=True)
class Identity:
    """A node's Ed25519 key pair, with its public key and peer id worked out once (a daemon
    asks for them at every signature, the simulator once per virtual node and machine)."""

    private_key: Ed25519PrivateKey
    public_key: bytes = field(init=False, repr=False, compare=False)
    peer_id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        public = self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        object.__setattr__(self, "public_key", public)
        object.__setattr__(self, "peer_id", peer_id_from_public_key(public))

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """Deterministic identity from a 32-byte seed (tests and the simulator)."""
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def seed(self) -> bytes:
        """The raw 32-byte private seed (what libp2p's Ed25519 key is built from)."""
        return self.private_key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


def verify_signature(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``."""
    if len(public_key) != PUBLIC_KEY_LEN or len(signature) != SIGNATURE_LEN:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def save_identity(identity: Identity, path: Path) -> None:
    """Write the key as PKCS#8 PEM with mode 0600, atomically."""
    pem = identity.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, KEY_FILE_MODE)
    try:
        os.fchmod(fd, KEY_FILE_MODE)  # O_CREAT's mode is masked by umask; be explicit
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_identity(path: Path) -> Identity:
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise KeyFileError(f"key file {path} does not exist (create one: symphony keygen)") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"key file {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or others can "
            f"access it; refusing to use it (fix: chmod 600 {path})"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"key file {path} is not a PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"key file {path} holds a {type(key).__name__}, not an Ed25519 key")
    return Identity(key)
