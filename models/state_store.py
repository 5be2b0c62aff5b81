"""The layer states an executor committed to, kept on disk for the verifiers that ask.

A committing executor (models/solver.py) keeps every decoder layer's output of each result
(models.layer_states, taken from its own generation on llama.cpp: models.llama_capture).
:meth:`StateStore.put` hashes the Merkle leaves where the states lie (no encoded copy), writes
the entry's file and returns the root, so the commitment can be sent; the one fsync and the
rename happen behind it, on the store's writer thread. An entry is one file in the store's
folder (a node's is ``<data dir>/states``, :data:`STATES_DIR`), ``<task id>-<states
root>.states``: a header (:data:`MAGIC`, layers, positions, hidden size), the leaf hashes
(proofs need no re-hashing), then the states as little-endian float32.

Crash safety. ``put`` writes ``<stem>.states.tmp`` whole (into the page cache) before it
returns; the writer fsyncs it and renames it into place, so a ``.states`` file is always whole,
after a power cut too. Until the rename, checks are served from the ``.tmp`` (the same
bytes). A kill (SIGKILL) leaves the ``.tmp`` whole in the kernel: the next store opened on the
folder checks it against the root its name carries (every leaf re-hashed) and lands it. A
``.tmp`` that fails that check (a power cut before the fsync) becomes a tombstone, so a check
of that result is answered "evicted" (inconclusive, see
``protocol.verification.rules.states_refusal_convicts``), never "not held" (a conviction); so
does a write that fails (a full disk), counted in ``write_errors``. At most
:data:`MAX_PENDING` entries wait for the writer; ``put`` blocks beyond that.

Eviction: the store holds at most ``budget_bytes``, oldest entries first out, but never drops
an entry younger than ``keep_ms``, which defaults to the verification check window
(``protocol.verification.rules.states_check_window_ms``, about 3.5 minutes by default): states
are only asked for within it, so an honest executor always still holds what a check in time
asks for, even if that makes the store exceed its budget for a while. An evicted entry
leaves a small tombstone (``<stem>.evicted``, the newest ``MAX_TOMBSTONES`` kept), so a late
request is answered "evicted" (:class:`StatesEvicted`: the check is inconclusive) rather than
"never held" (a conviction). SmolLM2-135M keeps ~70 KB per token of prompt + output (14 MB for
a 200-token result), so the default 1 GiB holds ~70 entries.

One daemon has one store per folder (:meth:`StateStore.shared`): its executor writes to the
same object its states stream reads from, so both know which entries are still landing (a
second store on the folder answers those "evicted" until they land).
"""

from __future__ import annotations

import os
import struct
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, ClassVar

import numpy as np

from crypto.hashing import HASH_LEN
from crypto.merkle import leaf_hash_of_parts, merkle_proof_of_hashes, merkle_root_of_hashes
from models.layer_states import (
    BLOCK_TOKENS,
    encode_leaf,
    leaf_header,
    leaf_position,
    n_blocks,
)
from protocol.verification.rules import encode_proof, states_check_window_ms
from protocol.verification.state import VerifyConfig

DEFAULT_BUDGET_BYTES = 1 << 30
#: entries younger than this are never evicted: the default verification check window
DEFAULT_KEEP_MS = states_check_window_ms(VerifyConfig())
#: tombstones of evicted entries kept (the oldest go first beyond it)
MAX_TOMBSTONES = 4096
#: entries written to the page cache but not yet fsynced and renamed; a put beyond it waits
MAX_PENDING = 4
#: the store's folder under a node's data dir
STATES_DIR = "states"
SUFFIX = ".states"
MAGIC = b"SYMSTAT1"
_HEAD = struct.Struct("<8sIII")  # magic, layers, positions, hidden size


class StatesMissing(LookupError):
    """The store does not hold the states asked for (never kept, or damaged)."""


class StatesEvicted(StatesMissing):
    """The store held the states asked for and dropped them (older than the check window, or
    lost to a kill or a failed write before they reached the disk)."""


class StateStore:
    _shared: ClassVar[dict[Path, StateStore]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()
    #: the stores open in this process, per folder: a folder's first one recovers it
    _open: ClassVar[weakref.WeakValueDictionary[Path, StateStore]] = (
        weakref.WeakValueDictionary())
    _open_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, root: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 keep_ms: int = DEFAULT_KEEP_MS) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self.keep_ms = keep_ms
        self._lock = threading.Lock()
        #: entries whose file has not landed: stem name -> written (only the fsync and the
        #: rename are left; False while ``put`` still writes it)
        self._pending: dict[str, bool] = {}
        self._slots = threading.Semaphore(MAX_PENDING)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-store")
        #: entries the writer handled (landed or failed), and its thread's CPU and wall time
        self.writes = 0
        self.write_cpu_s = 0.0
        self.write_wall_s = 0.0
        #: writes that failed (each left a tombstone), and the last one's reason
        self.write_errors = 0
        self.last_write_error = ""
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with StateStore._open_lock:  # not beside a live store: its temporaries are its own
            recover = StateStore._open.setdefault(root.resolve(), self) is self
        if recover:
            self._recover()

    @classmethod
    def shared(cls, root: Path) -> StateStore:
        """The one store of this process on ``root`` (created with the defaults)."""
        key = root.resolve()
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(root)
            return cls._shared[key]

    def _stem(self, task_id: bytes, states_root: bytes) -> Path:
        return self.root / f"{task_id.hex()}-{states_root.hex()}"

    def put(self, task_id: bytes, states: np.ndarray) -> tuple[bytes, int]:
        """Keep (L, T, C) layer outputs; return (Merkle root, L). ``states`` is read before
        this returns (the caller may reuse its buffer at once); the file's fsync and rename
        happen behind (see the module docstring)."""
        if states.ndim != 3 or states.dtype != np.float32:
            raise ValueError(f"layer states must be (L, T, C) float32, got {states.shape} "
                             f"{states.dtype}")
        L, T, C = states.shape
        hashes = _leaf_hashes(states)
        root = merkle_root_of_hashes([hashes[i:i + HASH_LEN]
                                      for i in range(0, len(hashes), HASH_LEN)])
        stem = self._stem(task_id, root)
        tmp = stem.with_suffix(SUFFIX + ".tmp")
        self._slots.acquire()
        with self._lock:
            if stem.name in self._pending or stem.with_suffix(SUFFIX).exists():
                self._slots.release()  # the same states again (the root names them)
                return root, L
            self._pending[stem.name] = False
        try:
            with open(tmp, "wb") as f:  # into the page cache: a kill from here on loses
                f.write(_HEAD.pack(MAGIC, L, T, C))  # nothing the next start cannot check
                f.write(hashes)
                for layer in states:
                    f.write(memoryview(np.ascontiguousarray(layer, dtype="<f4")).cast("B"))
        except BaseException:
            tmp.unlink(missing_ok=True)
            with self._lock:
                del self._pending[stem.name]
            self._slots.release()
            raise
        with self._lock:
            self._pending[stem.name] = True
        self._writer.submit(self._land, stem)
        return root, L

    def flush(self) -> None:
        """Wait until every entry put so far is on disk (or has failed)."""
        self._writer.submit(lambda: None).result()

    def _land(self, stem: Path) -> None:
        """The writer thread: fsync an entry's file and rename it into place."""
        started, cpu = time.perf_counter(), time.thread_time()
        tmp = stem.with_suffix(SUFFIX + ".tmp")
        try:
            _fsync(tmp)
            lost = None
        except OSError as exc:  # lost before it landed: inconclusive for a check, as a kill
            lost = exc
        with self._lock:  # renamed and no longer pending at once, for readers (_held)
            try:
                if lost is None:
                    os.replace(tmp, stem.with_suffix(SUFFIX))
            except OSError as exc:
                lost = exc
            if lost is not None:
                self.write_errors += 1
                self.last_write_error = f"{stem.name}: {lost}"
                tmp.unlink(missing_ok=True)
                stem.with_suffix(".evicted").touch()
            del self._pending[stem.name]
            try:
                self._collect()
            except OSError as exc:  # tried again after the next write
                self.last_write_error = f"eviction: {exc}"
        self._slots.release()
        self.writes += 1
        self.write_cpu_s += time.thread_time() - cpu
        self.write_wall_s += time.perf_counter() - started

    def _held(self, stem: Path) -> tuple[np.ndarray, bytes]:
        """(states (L, T, C), leaf hashes) of an entry, from its file (the temporary one
        while the writer has not landed it)."""
        try:
            with self._lock:  # the writer renames under the lock: the name opened is current
                landing = self._pending.get(stem.name)
                if landing is False:
                    raise StatesEvicted(f"states of {stem.name[:12]} are being written")
                f = open(stem.with_suffix(SUFFIX + ".tmp" if landing else SUFFIX), "rb")
            with f:
                return _read_entry(f)
        except (FileNotFoundError, struct.error) as exc:
            if stem.with_suffix(".evicted").exists():
                raise StatesEvicted(f"states of {stem.name[:12]} were evicted") from exc
            if stem.with_suffix(SUFFIX + ".tmp").exists():  # another store is writing it
                raise StatesEvicted(f"states of {stem.name[:12]} are being written") from exc
            raise StatesMissing(f"no states for task {stem.name[:12]}") from exc
        except ValueError as exc:
            raise StatesMissing(f"states of task {stem.name[:12]} are damaged") from exc

    def leaves(self, task_id: bytes, states_root: bytes,
               indices: Sequence[int]) -> list[tuple[int, bytes, bytes]]:
        """(index, leaf, encoded proof) for each index; StatesMissing / IndexError."""
        states, raw = self._held(self._stem(task_id, states_root))
        hashes = [raw[i:i + HASH_LEN] for i in range(0, len(raw), HASH_LEN)]
        L, T, _ = states.shape
        blocks = n_blocks(T)
        out = []
        for index in indices:
            if not 0 <= index < L * blocks:
                raise IndexError(f"leaf {index} of {L * blocks}")
            layer, block = leaf_position(index, blocks)
            leaf = encode_leaf(layer, block, np.asarray(
                states[layer - 1, block * BLOCK_TOKENS:(block + 1) * BLOCK_TOKENS]))
            out.append((index, leaf, encode_proof(merkle_proof_of_hashes(hashes, index))))
        return out

    def _recover(self) -> None:
        """What a kill left: an entry whose file was written but not landed is checked (its
        leaves hash to the root its name carries) and landed, or else recorded as lost (a
        tombstone); the former format's files (``.npy`` states, ``.hashes``) as evicted."""
        for stray in self.root.glob(f"*{SUFFIX}.tmp"):
            stem = self.root / stray.name[:-len(SUFFIX + ".tmp")]
            try:
                if _entry_is_whole(stray, stem.name.rpartition("-")[2]):
                    _fsync(stray)
                    os.replace(stray, stem.with_suffix(SUFFIX))
                    continue
            except OSError:
                pass
            stem.with_suffix(".evicted").touch()
            stray.unlink(missing_ok=True)
        for stray in self.root.glob("*.tmp"):
            stray.unlink(missing_ok=True)
        for old in self.root.glob("*.npy"):
            old.with_suffix(".evicted").touch()
            old.unlink(missing_ok=True)
        for old in self.root.glob("*.hashes"):
            old.unlink(missing_ok=True)

    def _collect(self) -> None:
        """Drop the oldest entries beyond the budget, none younger than ``keep_ms``."""
        entries = sorted(self.root.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in entries)
        young_after = time.time() - self.keep_ms / 1000
        while entries and total > self.budget_bytes:
            old = entries.pop(0)
            if old.stat().st_mtime > young_after:
                break  # still inside the check window: kept, over budget or not
            total -= old.stat().st_size
            old.with_suffix(".evicted").touch()
            old.unlink(missing_ok=True)
        tombstones = sorted(self.root.glob("*.evicted"), key=lambda p: p.stat().st_mtime)
        for stale in tombstones[:max(0, len(tombstones) - MAX_TOMBSTONES)]:
            stale.unlink(missing_ok=True)


def _leaf_hashes(states: np.ndarray) -> bytes:
    """The Merkle leaf hashes of (L, T, C) float32 states, in Merkle order: each leaf's rows
    hashed where they lie (``leaf_hash(encode_leaf(...))``, without building the leaf)."""
    L, T, C = states.shape
    out = []
    for layer in range(1, L + 1):
        for b in range(n_blocks(T)):
            rows = np.ascontiguousarray(
                states[layer - 1, b * BLOCK_TOKENS:(b + 1) * BLOCK_TOKENS], dtype="<f4")
            out.append(leaf_hash_of_parts((leaf_header(layer, b, len(rows), C),
                                           memoryview(rows).cast("B"))))
    return b"".join(out)


def _read_entry(f: BinaryIO) -> tuple[np.ndarray, bytes]:
    """(states (L, T, C) mapped from the file, leaf hashes) of an open entry file;
    ValueError when it is not a whole entry, struct.error when shorter than its header."""
    magic, L, T, C = _HEAD.unpack(f.read(_HEAD.size))
    raw = f.read(L * n_blocks(T) * HASH_LEN)
    offset = _HEAD.size + len(raw)
    size = os.fstat(f.fileno()).st_size
    if magic != MAGIC or not L * T * C or len(raw) != L * n_blocks(T) * HASH_LEN or size != (
            offset + 4 * L * T * C):
        raise ValueError(f"{f.name}: not a whole states entry")
    return np.memmap(f, dtype="<f4", mode="r", offset=offset, shape=(L, T, C)), raw


def _entry_is_whole(path: Path, root_hex: str) -> bool:
    """Whether an entry file holds states whose leaves hash to its hashes, and they to the
    root ``root_hex`` (the one its name carries)."""
    try:
        with open(path, "rb") as f:
            states, raw = _read_entry(f)
            return _leaf_hashes(states) == raw and merkle_root_of_hashes(
                [raw[i:i + HASH_LEN] for i in range(0, len(raw), HASH_LEN)]) == bytes.fromhex(
                root_hex)
    except (OSError, ValueError, struct.error):
        return False


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
