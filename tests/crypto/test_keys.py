from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from crypto.keys import Identity, KeyFileError, load_identity, save_identity, verify_signature
from crypto.peer_id import InvalidPeerId, peer_id_from_public_key, public_key_from_peer_id


def test_save_load_round_trip_with_mode_0600(tmp_path: Path) -> None:
    ident = Identity.generate()
    path = tmp_path / "node.key"
    save_identity(ident, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = load_identity(path)
    assert loaded.public_key == ident.public_key
    assert loaded.peer_id == ident.peer_id
    assert not (tmp_path / "node.key.tmp").exists()


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o640, 0o660, 0o666])
def test_refuses_key_readable_by_others(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.key"
    save_identity(Identity.generate(), path)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match=f"mode {mode:04o}.*chmod 600"):
        load_identity(path)


def test_missing_and_garbage_key_files(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="does not exist"):
        load_identity(tmp_path / "nope.key")
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"not a key")
    bad.chmod(0o600)
    with pytest.raises(KeyFileError, match="not a PEM private key"):
        load_identity(bad)


def test_seed_is_deterministic_and_signatures_verify() -> None:
    a = Identity.from_seed(b"\x01" * 32)
    b = Identity.from_seed(b"\x01" * 32)
    assert a.public_key == b.public_key and a.seed == b"\x01" * 32
    sig = a.sign(b"msg")
    assert verify_signature(a.public_key, b"msg", sig)
    assert not verify_signature(a.public_key, b"msg!", sig)
    assert not verify_signature(a.public_key, b"msg", sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not verify_signature(b"\x00" * 31, b"msg", sig)


def test_peer_id_golden_and_round_trip() -> None:
    ident = Identity.from_seed(b"\x00" * 32)
    # libp2p renders Ed25519 identity-multihash peer ids starting with 12D3KooW
    assert ident.peer_id.startswith("12D3KooW")
    assert ident.peer_id == "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
    assert public_key_from_peer_id(ident.peer_id) == ident.public_key
    assert peer_id_from_public_key(ident.public_key) == ident.peer_id
    for bad in ["", "0OIl", "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"]:
        with pytest.raises(InvalidPeerId):
            public_key_from_peer_id(bad)
