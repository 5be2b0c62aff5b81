"""The chunk store: verified atomic writes, resume after a restart, export, GC."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from crypto.keys import Identity
from crypto.merkle import leaf_hash
from node.relay.chunk_store import ChunkStore, ChunkStoreError
from protocol.relay.manifest import Manifest, chunk_hash, make_body, sign_manifest

PUB = Identity.from_seed(b"\x05" * 32)
CHUNK = 4096


def artifact(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def publish(store: ChunkStore, path: Path, version: int, name: str = "m") -> Manifest:
    hashes, total = store.import_file(path, CHUNK)
    body = make_body(
        name=name, version=version, chunk_size=CHUNK, chunk_hashes=hashes, total_size=total
    )
    m = sign_manifest(PUB, body)
    store.save_manifest(m)
    return m


def test_chunk_hash_is_the_merkle_leaf_hash(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path)
    data = artifact(1, 10_000)
    h = store.put(data)
    assert h == leaf_hash(data) == chunk_hash(data)
    assert store.read_chunk(h) == data
    assert store.object_path(h).name == h.hex()


def test_writer_verifies_before_the_rename(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path)
    data = artifact(2, CHUNK)
    w = store.writer(CHUNK)
    for i in range(0, CHUNK, 1000):  # arrives in pieces; hashed as it arrives
        w.write(data[i : i + 1000])
    with pytest.raises(ChunkStoreError, match="does not verify"):
        w.commit(chunk_hash(b"something else"))
    assert not store.has(chunk_hash(data)) and not list(store.tmp.iterdir())
    short = store.writer(CHUNK)
    short.write(data[:100])
    with pytest.raises(ChunkStoreError):
        short.commit(chunk_hash(data[:100]))  # right hash, wrong size: refused
    long = store.writer(10)
    with pytest.raises(ChunkStoreError, match="longer"):
        long.write(data[:11])
    long.abort()
    assert not list(store.tmp.iterdir())


def test_import_export_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "weights.bin"
    data = artifact(3, 5 * CHUNK + 123)
    src.write_bytes(data)
    store = ChunkStore(tmp_path / "chunks")
    m = publish(store, src, 1)
    assert m.chunks == 6 and m.body.total_size == len(data)
    assert store.present(m) == frozenset(range(6))
    out = tmp_path / "out.bin"
    store.export(m, out)
    assert out.read_bytes() == data
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_export_refuses_a_damaged_chunk_and_leaves_no_file(tmp_path: Path) -> None:
    src = tmp_path / "w.bin"
    src.write_bytes(artifact(4, 3 * CHUNK))
    store = ChunkStore(tmp_path / "chunks")
    m = publish(store, src, 1)
    damaged = store.object_path(m.chunk_hashes[1])
    damaged.write_bytes(b"\0" * CHUNK)
    with pytest.raises(ChunkStoreError, match="damaged"):
        store.export(m, tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists()
    # a verifying scan finds it and deletes it, so the relay fetches it again
    assert store.present(m) == frozenset({0, 1, 2})
    assert store.present(m, verify=True) == frozenset({0, 2})
    assert not damaged.exists()


def test_resume_after_restart(tmp_path: Path) -> None:
    src = tmp_path / "w.bin"
    data = artifact(5, 8 * CHUNK)
    src.write_bytes(data)
    publisher = ChunkStore(tmp_path / "pub")
    m = publish(publisher, src, 1)
    # a receiver got chunks 0..3, and was killed in the middle of chunk 4
    root = tmp_path / "recv"
    recv = ChunkStore(root)
    recv.save_manifest(m)
    for i in range(4):
        recv.put(data[i * CHUNK : (i + 1) * CHUNK])
    w = recv.writer(CHUNK)
    w.write(data[4 * CHUNK : 4 * CHUNK + 100])  # never committed
    del recv, w
    again = ChunkStore(root)
    assert not list(again.tmp.iterdir())  # the partial chunk is gone
    assert [x.id for x in again.manifests()] == [m.id]
    assert again.present(again.manifests()[0], verify=True) == frozenset(range(4))


def test_corrupt_manifest_files_are_dropped(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path)
    src = tmp_path / "w.bin"
    src.write_bytes(artifact(6, CHUNK))
    m = publish(store, src, 1)
    (store.manifest_dir / ("ab" * 32 + ".manifest")).write_bytes(b"garbage")
    renamed = store.manifest_dir / ("cd" * 32 + ".manifest")  # valid content, wrong name
    renamed.write_bytes((store.manifest_dir / f"{m.id.hex()}.manifest").read_bytes())
    assert [x.id for x in store.manifests()] == [m.id]
    assert len(list(store.manifest_dir.iterdir())) == 1


def test_gc_keeps_the_newest_versions_and_shared_chunks(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path / "chunks")
    shared = artifact(7, CHUNK)
    versions = []
    for v in (1, 2, 3):
        src = tmp_path / f"v{v}.bin"
        src.write_bytes(shared + artifact(10 + v, 2 * CHUNK))  # chunk 0 shared by all
        versions.append(publish(store, src, v))
    other = tmp_path / "other.bin"
    other.write_bytes(artifact(20, CHUNK))
    keep_other = publish(store, other, 1, name="other")
    removed = store.gc(keep=2)
    assert removed == 2  # v1's two own chunks
    assert {m.id for m in store.manifests()} == {versions[1].id, versions[2].id, keep_other.id}
    assert store.has(chunk_hash(shared))
    assert store.present(versions[2]) == frozenset(range(3))
    assert store.present(versions[0]) == frozenset({0})
    store.drop_manifest(keep_other.id)
    assert store.collect() == 1
    with pytest.raises(ValueError):
        store.gc(keep=0)


def test_import_limits(tmp_path: Path) -> None:
    store = ChunkStore(tmp_path / "chunks")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(ChunkStoreError, match="empty"):
        store.import_file(empty, CHUNK)
    with pytest.raises(ChunkStoreError, match="chunks"):
        big = tmp_path / "big"
        with open(big, "wb") as f:
            f.truncate(8193 * CHUNK)  # sparse: one chunk more than a manifest can list
        store.import_file(big, CHUNK)
