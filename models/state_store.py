"""The layer states an executor committed to, kept on disk for the verifiers that ask.

A committing executor (models/solver.py) keeps every decoder layer's output of each result
(models.layer_states, taken from its own generation on llama.cpp: models.llama_capture); :meth:`StateStore.put` writes them into its
folder (a node's is ``<data dir>/states``, :data:`STATES_DIR`) as ``<task id>-<states
root>.npy`` beside a ``.hashes`` file of the Merkle leaf hashes (so proofs need no
re-hashing), each written to a temporary name and renamed into place: a kill leaves either
a whole entry or a stray temporary, never half a file that would be served. The states file
is written last, so it marks a complete entry.

Eviction: the store holds at most ``budget_bytes``, oldest entries first out, but never drops
an entry younger than ``keep_ms``, which defaults to the verification check window
(``protocol.verification.rules.states_check_window_ms``, about 3.5 minutes by default): states
are only asked for within it, so an honest executor always still holds what a check in time
asks for, even if that makes the store exceed its budget for a while. An evicted entry
leaves a small tombstone (``<stem>.evicted``, the newest ``MAX_TOMBSTONES`` kept), so a late
request is answered "evicted" (:class:`StatesEvicted`: the check is inconclusive) rather than
"never held" (a conviction). SmolLM2-135M keeps ~70 KB per token of prompt + output (14 MB for
a 200-token result), so the default 1 GiB holds ~70 entries.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from crypto.hashing import HASH_LEN
from crypto.merkle import leaf_hash, merkle_proof_of_hashes, merkle_root_of_hashes
from models.layer_states import BLOCK_TOKENS, blocks_of, encode_leaf, leaf_position, n_blocks
from protocol.verification.rules import encode_proof, states_check_window_ms
from protocol.verification.state import VerifyConfig

DEFAULT_BUDGET_BYTES = 1 << 30
#: entries younger than this are never evicted: the default verification check window
DEFAULT_KEEP_MS = states_check_window_ms(VerifyConfig())
#: tombstones of evicted entries kept (the oldest go first beyond it)
MAX_TOMBSTONES = 4096
#: the store's folder under a node's data dir
STATES_DIR = "states"


class StatesMissing(LookupError):
    """The store does not hold the states asked for (never kept, or damaged)."""


class StatesEvicted(StatesMissing):
    """The store held the states asked for and dropped them (older than the check window)."""


class StateStore:
    def __init__(self, root: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 keep_ms: int = DEFAULT_KEEP_MS) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self.keep_ms = keep_ms
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stray in root.glob("*.tmp"):
            stray.unlink(missing_ok=True)

    def _stem(self, task_id: bytes, states_root: bytes) -> Path:
        return self.root / f"{task_id.hex()}-{states_root.hex()}"

    def put(self, task_id: bytes, states: np.ndarray) -> tuple[bytes, int]:
        """Keep (L, T, C) layer outputs; return (Merkle root, L)."""
        if states.ndim != 3 or states.dtype != np.float32:
            raise ValueError(f"layer states must be (L, T, C) float32, got {states.shape} "
                             f"{states.dtype}")
        hashes = [leaf_hash(encode_leaf(layer, b, rows))
                  for (layer, b), rows in blocks_of(states).items()]
        root = merkle_root_of_hashes(hashes)
        stem = self._stem(task_id, root)
        with self._lock:
            _write_atomic(stem.with_suffix(".hashes"), b"".join(hashes))
            tmp = stem.with_suffix(".npy.tmp")
            with open(tmp, "wb") as f:
                np.save(f, states, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, stem.with_suffix(".npy"))
            self._collect()
        return root, states.shape[0]

    def leaves(self, task_id: bytes, states_root: bytes,
               indices: Sequence[int]) -> list[tuple[int, bytes, bytes]]:
        """(index, leaf, encoded proof) for each index; StatesMissing / IndexError."""
        stem = self._stem(task_id, states_root)
        try:
            states = np.load(stem.with_suffix(".npy"), mmap_mode="r", allow_pickle=False)
            raw = stem.with_suffix(".hashes").read_bytes()
        except (FileNotFoundError, ValueError) as exc:
            if stem.with_suffix(".evicted").exists():
                raise StatesEvicted(f"states of task {task_id.hex()[:12]} were evicted") from exc
            raise StatesMissing(f"no states for task {task_id.hex()[:12]}") from exc
        hashes = [raw[i:i + HASH_LEN] for i in range(0, len(raw), HASH_LEN)]
        L, T, _ = states.shape
        blocks = n_blocks(T)
        if len(hashes) != L * blocks:
            raise StatesMissing(f"states of task {task_id.hex()[:12]} are damaged")
        out = []
        for index in indices:
            if not 0 <= index < L * blocks:
                raise IndexError(f"leaf {index} of {L * blocks}")
            layer, block = leaf_position(index, blocks)
            leaf = encode_leaf(layer, block, np.asarray(
                states[layer - 1, block * BLOCK_TOKENS:(block + 1) * BLOCK_TOKENS]))
            out.append((index, leaf, encode_proof(merkle_proof_of_hashes(hashes, index))))
        return out

    def _collect(self) -> None:
        """Drop the oldest entries beyond the budget, none younger than ``keep_ms``."""
        entries = sorted(self.root.glob("*.npy"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in entries)
        young_after = time.time() - self.keep_ms / 1000
        while entries and total > self.budget_bytes:
            old = entries.pop(0)
            if old.stat().st_mtime > young_after:
                break  # still inside the check window: kept, over budget or not
            total -= old.stat().st_size
            old.with_suffix(".evicted").touch()
            old.unlink(missing_ok=True)
            old.with_suffix(".hashes").unlink(missing_ok=True)
        tombstones = sorted(self.root.glob("*.evicted"), key=lambda p: p.stat().st_mtime)
        for stale in tombstones[:max(0, len(tombstones) - MAX_TOMBSTONES)]:
            stale.unlink(missing_ok=True)
        live = {p.stem for p in self.root.glob("*.npy")}
        for h in self.root.glob("*.hashes"):
            if h.stem not in live and not h.with_suffix(".npy.tmp").exists():
                h.unlink(missing_ok=True)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
