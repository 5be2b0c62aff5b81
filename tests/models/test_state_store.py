"""The state store (models/state_store.py): the root it returns at once is the Merkle root of
the encoded leaves; until the writer lands the file, checks are served from its temporary; a
kill before that loses nothing, and a half-written temporary (a power cut) or a failed write
leaves the entry "evicted" (inconclusive), never "not held" (a conviction)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crypto.merkle import merkle_root
from models.layer_states import blocks_of, encode_leaf
from models.state_store import (
    MAX_PENDING,
    SUFFIX,
    StatesEvicted,
    StatesMissing,
    StateStore,
)

TASK = b"\x07" * 32


def states(seed: int = 0, shape: tuple[int, int, int] = (3, 70, 16)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture
def held_writer(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The writer thread stops at its fsync until the returned event is set."""
    release = threading.Event()
    real = os.fsync

    def fsync(fd: int) -> None:
        assert release.wait(30), "the test never released the writer"
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield release
    release.set()


def test_root_is_the_merkle_root_of_the_encoded_leaves(tmp_path: Path) -> None:
    for shape in ((3, 70, 16), (2, 32, 8), (1, 1, 4)):
        s = states(1, shape)
        root, layers = StateStore(tmp_path).put(TASK, s)
        assert layers == shape[0]
        assert root == merkle_root([encode_leaf(la, b, rows)
                                    for (la, b), rows in blocks_of(s).items()])


def test_a_check_before_the_file_lands_is_served_from_its_temporary(
        tmp_path: Path, held_writer: threading.Event) -> None:
    store = StateStore(tmp_path)
    buffer = states()
    root, _ = store.put(TASK, buffer)
    buffer[:] = 0.0  # the caller reuses its buffer at once (the capture's next generation)
    assert list(tmp_path.glob(f"*{SUFFIX}.tmp")) and not list(tmp_path.glob(f"*{SUFFIX}"))
    early = store.leaves(TASK, root, [0, 4, 8])
    held_writer.set()
    store.flush()
    assert list(tmp_path.glob(f"*{SUFFIX}")) and not list(tmp_path.glob("*.tmp"))
    assert store.leaves(TASK, root, [0, 4, 8]) == early
    assert store.writes == 1 and store.write_errors == 0
    # a second store on the folder (a restarted daemon) serves the same from the file
    assert StateStore(tmp_path).leaves(TASK, root, [0, 4, 8]) == early


def test_a_store_beside_the_writing_one_calls_the_entry_inconclusive(
        tmp_path: Path, held_writer: threading.Event) -> None:
    writing, beside = StateStore(tmp_path), StateStore(tmp_path)
    root, _ = writing.put(TASK, states())
    with pytest.raises(StatesEvicted, match="being written"):
        beside.leaves(TASK, root, [0])
    held_writer.set()
    writing.flush()
    assert beside.leaves(TASK, root, [0]) == writing.leaves(TASK, root, [0])


def test_a_kill_before_the_file_lands_loses_nothing(
        tmp_path: Path, held_writer: threading.Event) -> None:
    store = StateStore(tmp_path / "a")
    root, _ = store.put(TASK, states())
    served = store.leaves(TASK, root, [0, 8])
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the folder as a SIGKILL now leaves it
    held_writer.set()
    restarted = StateStore(tmp_path / "b")  # checks the temporary against its root: lands it
    assert [p.suffix for p in (tmp_path / "b").iterdir()] == [SUFFIX]
    assert restarted.leaves(TASK, root, [0, 8]) == served


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_half_written_temporary_leaves_it_evicted_not_unheld(
        tmp_path: Path, held_writer: threading.Event, damage: str) -> None:
    root, _ = StateStore(tmp_path / "a").put(TASK, states())
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    held_writer.set()
    tmp = next((tmp_path / "b").glob("*.tmp"))
    raw = tmp.read_bytes()  # what a power cut before the fsync may leave
    tmp.write_bytes(raw[:-100] if damage == "truncated" else raw[:-100] + b"\1" * 100)
    restarted = StateStore(tmp_path / "b")
    assert [p.suffix for p in (tmp_path / "b").iterdir()] == [".evicted"]
    with pytest.raises(StatesEvicted):
        restarted.leaves(TASK, root, [0])
    with pytest.raises(StatesMissing) as never:
        restarted.leaves(b"\x01" * 32, root, [0])
    assert not isinstance(never.value, StatesEvicted)


def test_a_failed_write_is_counted_and_leaves_the_entry_evicted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    store = StateStore(tmp_path)
    root, _ = store.put(TASK, states())
    store.flush()
    assert store.write_errors == 1 and "No space" in store.last_write_error
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(f"*{SUFFIX}"))
    with pytest.raises(StatesEvicted):
        store.leaves(TASK, root, [0])


def test_puts_wait_for_the_writer_beyond_max_pending(
        tmp_path: Path, held_writer: threading.Event) -> None:
    store = StateStore(tmp_path)
    for i in range(MAX_PENDING):
        store.put(bytes([i]) * 32, states(i))
    slots: Any = store._slots
    assert not slots.acquire(blocking=False)  # the next put would wait
    held_writer.set()
    store.flush()
    assert slots.acquire(blocking=False)
    slots.release()
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == MAX_PENDING


def test_the_same_states_twice_keep_one_entry(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    first = store.put(TASK, states())
    assert store.put(TASK, states()) == first
    store.flush()
    assert store.put(TASK, states()) == first
    store.flush()
    assert len(list(tmp_path.iterdir())) == 1 and store.writes == 1


def test_damaged_or_truncated_files_are_not_served(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    root, _ = store.put(TASK, states())
    store.flush()
    path = next(tmp_path.glob(f"*{SUFFIX}"))
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(StatesMissing, match="damaged"):
        store.leaves(TASK, root, [0])
    path.write_bytes(b"SYMSTAT")
    with pytest.raises(StatesMissing):
        store.leaves(TASK, root, [0])
    with pytest.raises(ValueError, match="float32"):
        store.put(TASK, states().astype(np.float64))
    other = StateStore(tmp_path / "x")
    with pytest.raises(IndexError):
        other.leaves(TASK, other.put(TASK, states())[0], [9])  # 3 layers x 3 blocks


def test_the_former_format_and_stray_temporaries_are_cleared_at_open(tmp_path: Path) -> None:
    stem = f"{TASK.hex()}-{'ab' * 32}"
    np.save(tmp_path / f"{stem}.npy", states())
    (tmp_path / f"{stem}.hashes").write_bytes(b"\0" * 32)
    (tmp_path / "junk.npy.tmp").write_bytes(b"half a file")
    StateStore(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{stem}.evicted"]


def test_one_daemon_shares_one_store_per_folder(tmp_path: Path) -> None:
    assert StateStore.shared(tmp_path / "s") is StateStore.shared(tmp_path / "s" / ".." / "s")
    assert StateStore.shared(tmp_path / "s") is not StateStore.shared(tmp_path / "t")
