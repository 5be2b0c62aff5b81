"""The content-addressed chunk store of the weight relay: ``data_dir/chunks``.

Contract
--------
* Layout: ``objects/<2 hex>/<64 hex>`` holds one chunk whose ``chunk_hash`` (Merkle leaf hash,
  BLAKE2b-256) is its name; ``manifests/<64 hex>.manifest`` holds an encoded ``RelayManifest``;
  ``tmp/`` holds chunks being received. Identical chunks (in one version or across versions)
  are stored once.
* Verified and atomic: a chunk is written to ``tmp/`` while its hash is computed piece by piece
  (no whole-chunk buffering), and renamed into ``objects/`` only if its hash is the one
  expected. An object file is therefore always complete and named by its content: a process
  killed at any instant leaves at most a stray temporary file, which ``ChunkStore()`` removes.
  (``durable=True`` also fsyncs before the rename, for OS crashes; off by default, as a relay
  re-fetches what a crash lost.)
* Resumable: after a restart, ``manifests()`` lists the saved manifests (re-verified) and
  ``present(manifest)`` the chunks already held, so a transfer continues where it stopped.
* Garbage collection: ``drop_manifest`` forgets a version and ``collect()`` deletes every
  object no remaining manifest references; ``gc(keep)`` keeps the newest ``keep`` versions per
  artifact ``(signer, name)`` and collects.

All methods are blocking file I/O: the relay service calls the big ones (import, export,
verify) in a worker thread.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from crypto.hashing import HASH_LEN
from protocol.codec import decode, encode
from protocol.errors import InvalidMessage
from protocol.relay.manifest import (
    MAX_CHUNKS,
    Manifest,
    ManifestError,
    RelayManifest,
    chunk_count,
    verify_manifest,
)

_LEAF_PERSON = b"symphony-leaf"  # crypto.merkle.leaf_hash, computed incrementally here
#: bytes read or written per step when streaming files (bounded memory)
IO_PIECE = 1 << 20
#: encoded manifests larger than this are refused when loading
MAX_MANIFEST_FILE = 1 << 20


class ChunkStoreError(Exception):
    """A chunk does not match its hash, or a file the store needs is missing or wrong."""


def _leaf_hasher() -> hashlib.blake2b:
    return hashlib.blake2b(digest_size=HASH_LEN, person=_LEAF_PERSON)


class ChunkWriter:
    """One chunk being received: write pieces, read ``digest``, then ``commit`` or ``abort``."""

    def __init__(self, store: ChunkStore, tmp: Path, size: int) -> None:
        self._store = store
        self._tmp = tmp
        self._size = size
        self._written = 0
        self._hasher = _leaf_hasher()
        self._file: BinaryIO | None = open(tmp, "wb")  # noqa: SIM115 - closed in commit/abort

    @property
    def written(self) -> int:
        return self._written

    @property
    def size(self) -> int:
        return self._size

    def write(self, data: bytes) -> None:
        if self._file is None:
            raise ChunkStoreError("write to a finished chunk writer")
        if self._written + len(data) > self._size:
            raise ChunkStoreError(f"chunk longer than the {self._size} bytes announced")
        self._file.write(data)
        self._hasher.update(data)
        self._written += len(data)

    def digest(self) -> bytes:
        return self._hasher.digest()

    def commit(self, expected: bytes) -> Path:
        """Rename into place iff complete and hashing to ``expected``; else abort and raise."""
        if self._file is None:
            raise ChunkStoreError("commit of a finished chunk writer")
        if self._written != self._size or self.digest() != expected:
            self.abort()
            raise ChunkStoreError(
                f"chunk {expected.hex()[:16]} does not verify ({self._written}/{self._size} bytes)"
            )
        self._file.flush()
        if self._store.durable:
            os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        final = self._store.object_path(expected)
        final.parent.mkdir(exist_ok=True)
        os.replace(self._tmp, final)
        return final

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._tmp.unlink(missing_ok=True)


class ChunkStore:
    def __init__(self, root: Path, *, durable: bool = False) -> None:
        self.root = Path(root)
        self.durable = durable
        self.objects = self.root / "objects"
        self.manifest_dir = self.root / "manifests"
        self.tmp = self.root / "tmp"
        for d in (self.objects, self.manifest_dir, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        for stray in self.tmp.iterdir():  # partial chunks of a previous run
            stray.unlink(missing_ok=True)
        self._counter = itertools.count()

    # ------------------------------------------------------------ objects

    def object_path(self, chunk_hash: bytes) -> Path:
        h = chunk_hash.hex()
        return self.objects / h[:2] / h

    def has(self, chunk_hash: bytes) -> bool:
        return self.object_path(chunk_hash).is_file()

    def writer(self, size: int) -> ChunkWriter:
        tmp = self.tmp / f"{os.getpid()}-{next(self._counter)}.part"
        return ChunkWriter(self, tmp, size)

    def put(self, data: bytes) -> bytes:
        """Store ``data`` as one chunk; returns its hash."""
        w = self.writer(len(data))
        w.write(data)
        h = w.digest()
        w.commit(h)
        return h

    def open_chunk(self, chunk_hash: bytes) -> BinaryIO:
        try:
            return open(self.object_path(chunk_hash), "rb")
        except FileNotFoundError:
            raise ChunkStoreError(f"chunk {chunk_hash.hex()} is not in the store") from None

    def read_chunk(self, chunk_hash: bytes) -> bytes:
        with self.open_chunk(chunk_hash) as f:
            return f.read()

    def verify_chunk(self, chunk_hash: bytes) -> bool:
        """Re-hash an object file; a damaged one is deleted (it will be fetched again)."""
        hasher = _leaf_hasher()
        try:
            with self.open_chunk(chunk_hash) as f:
                while piece := f.read(IO_PIECE):
                    hasher.update(piece)
        except ChunkStoreError:
            return False
        if hasher.digest() != chunk_hash:
            self.object_path(chunk_hash).unlink(missing_ok=True)
            return False
        return True

    # ------------------------------------------------------------ manifests

    def save_manifest(self, manifest: Manifest) -> None:
        path = self.manifest_dir / f"{manifest.id.hex()}.manifest"
        if path.exists():
            return
        tmp = self.tmp / f"{os.getpid()}-{next(self._counter)}.manifest"
        tmp.write_bytes(encode(manifest.message))
        os.replace(tmp, path)

    def drop_manifest(self, manifest_id: bytes) -> None:
        (self.manifest_dir / f"{manifest_id.hex()}.manifest").unlink(missing_ok=True)

    def manifests(self) -> list[Manifest]:
        """Saved manifests, oldest version first; a file that fails to verify is removed."""
        out = []
        for path in sorted(self.manifest_dir.glob("*.manifest")):
            try:
                data = path.read_bytes()
                m = verify_manifest(decode(data, RelayManifest, max_frame=MAX_MANIFEST_FILE))
            except (OSError, InvalidMessage, ManifestError):
                path.unlink(missing_ok=True)
                continue
            if path.stem == m.id.hex():
                out.append(m)
            else:
                path.unlink(missing_ok=True)
        return sorted(out, key=lambda m: (m.signer, m.name, m.version))

    def present(self, manifest: Manifest, *, verify: bool = False) -> frozenset[int]:
        """Indices of ``manifest`` whose chunks are stored (re-hashed with ``verify``)."""
        held = {}
        for h in set(manifest.chunk_hashes):
            held[h] = self.verify_chunk(h) if verify else self.has(h)
        return frozenset(i for i, h in enumerate(manifest.chunk_hashes) if held[h])

    # ------------------------------------------------------------ files

    def import_file(self, path: Path, chunk_size: int) -> tuple[list[bytes], int]:
        """Cut a file into chunks in the store; returns (chunk hashes, total size)."""
        with open(path, "rb") as f:
            total = os.fstat(f.fileno()).st_size
            if total == 0:
                raise ChunkStoreError(f"{path} is empty")
            if chunk_count(total, chunk_size) > MAX_CHUNKS:
                raise ChunkStoreError(
                    f"{path} needs more than {MAX_CHUNKS} chunks of {chunk_size} bytes"
                )
            hashes: list[bytes] = []
            for offset in range(0, total, chunk_size):
                w = self.writer(min(chunk_size, total - offset))
                while w.written < w.size:
                    piece = f.read(min(IO_PIECE, w.size - w.written))
                    if not piece:
                        w.abort()
                        raise ChunkStoreError(f"{path} shrank while being imported")
                    w.write(piece)
                h = w.digest()
                w.commit(h)
                hashes.append(h)
        return hashes, total

    def iter_artifact(self, manifest: Manifest) -> Iterator[bytes]:
        """The artifact's bytes in pieces, each chunk verified against the manifest."""
        for h in manifest.chunk_hashes:
            hasher = _leaf_hasher()
            with self.open_chunk(h) as f:
                while piece := f.read(IO_PIECE):
                    hasher.update(piece)
                    yield piece
            if hasher.digest() != h:
                raise ChunkStoreError(f"stored chunk {h.hex()} is damaged")

    def export(self, manifest: Manifest, out: Path) -> None:
        """Write the whole artifact to ``out`` atomically (tmp + rename), verifying each chunk."""
        out = Path(out)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
        try:
            with open(tmp, "wb") as f:
                for piece in self.iter_artifact(manifest):
                    f.write(piece)
                size = f.tell()
            if size != manifest.body.total_size:
                raise ChunkStoreError(
                    f"artifact is {size} bytes, manifest says {manifest.body.total_size}"
                )
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------ garbage collection

    def collect(self) -> int:
        """Delete objects no saved manifest references; returns how many were deleted."""
        referenced = {h for m in self.manifests() for h in m.chunk_hashes}
        removed = 0
        for obj in self._all_objects():
            if bytes.fromhex(obj.name) not in referenced:
                obj.unlink(missing_ok=True)
                removed += 1
        return removed

    def gc(self, keep: int) -> int:
        """Keep the newest ``keep`` versions of each artifact; returns objects deleted."""
        if keep < 1:
            raise ValueError("keep at least one version")
        by_key: dict[tuple[str, str], list[Manifest]] = {}
        for m in self.manifests():
            by_key.setdefault(m.key, []).append(m)
        for versions in by_key.values():
            for old in sorted(versions, key=lambda m: m.version)[:-keep]:
                self.drop_manifest(old.id)
        return self.collect()

    def _all_objects(self) -> Iterable[Path]:
        for sub in self.objects.iterdir():
            if sub.is_dir():
                yield from (p for p in sub.iterdir() if len(p.name) == 2 * HASH_LEN)
