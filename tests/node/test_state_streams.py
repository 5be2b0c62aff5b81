"""The states stream (node/verification/state_streams.py) over an in-memory stream pair: honest leaves
arrive proven; a damaged, missing or unprovable leaf is the executor's failure (BadStates);
an executor nobody can reach is not (StatesUnavailable). And the store's eviction: a byte
budget, the check window, tombstones (tests/models/test_state_store.py has the rest)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from models.layer_states import BLOCK_TOKENS, n_blocks
from models.state_store import (
    DEFAULT_KEEP_MS,
    SUFFIX,
    StatesEvicted,
    StatesMissing,
    StateStore,
)
from node.runtime.limits import NetLimits
from node.transport import TransportError
from node.verification.state_streams import (
    BadStates,
    StatesQuota,
    StatesUnavailable,
    fetch_leaves,
    serve_states,
)
from protocol.verification.rules import states_check_window_ms, states_refusal_convicts
from protocol.verification.state import VerifyConfig
from tests.node.mem_streams import MemStream, Pipe

TASK = b"\x07" * 32
L, T, C = 3, 70, 16  # 3 blocks per layer


class MemTransport:
    """Opens a stream to a handler running in ``nursery`` (or fails, when ``handler`` is None)."""

    def __init__(self, nursery: trio.Nursery, handler: Any, connected: bool = True) -> None:
        self.nursery, self.handler, self.connected = nursery, handler, connected

    def connected_peers(self) -> list[str]:
        return ["exec"] if self.connected else []

    async def open_stream(self, peer_id: str, protocol_id: str) -> MemStream:
        if self.handler is None:
            raise TransportError("no route")
        a, b = Pipe(), Pipe()
        self.nursery.start_soon(self.handler, "verifier", MemStream(a, b, "verifier"))
        return MemStream(b, a, peer_id)


def entry(folder: Path, task: bytes, root: bytes) -> Path:
    return folder / f"{task.hex()}-{root.hex()}{SUFFIX}"


def states() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((L, T, C)).astype(np.float32)


WANTED = [(1, 0), (1, 1), (1, 2), (2, 1), (3, 2)]


async def _fetch(store: StateStore | None, root: bytes, *, connected: bool = True,
                 limits: NetLimits | None = None, task: bytes = TASK) -> dict:
    error: Exception | None = None
    got: dict = {}
    async with trio.open_nursery() as nursery:
        handler = serve_states(store, limits) if store is not None else None
        transport = MemTransport(nursery, handler, connected)
        try:
            got = await fetch_leaves(transport, "p", "exec", task, root,  # type: ignore[arg-type]
                                     L, T, WANTED)
        except Exception as exc:
            error = exc
        nursery.cancel_scope.cancel()
    if error is not None:
        raise error
    return got


def test_honest_leaves_arrive_proven(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    s = states()
    root, layers = store.put(TASK, s)
    assert layers == L and n_blocks(T) == 3
    got = trio.run(_fetch, store, root)
    assert sorted(got) == WANTED
    for (layer, block), arr in got.items():
        assert np.array_equal(arr, s[layer - 1, block * BLOCK_TOKENS:(block + 1) * BLOCK_TOKENS])


def test_damaged_states_fail_the_executor(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    s = states()
    root, _ = store.put(TASK, s)
    store.flush()
    path = entry(tmp_path, TASK, root)
    raw = bytearray(path.read_bytes())
    at = len(raw) - 4 * (L * T * C) + 4 * ((1 * T + 40) * C + 3)  # states[1, 40, 3]
    raw[at:at + 4] = (np.frombuffer(raw[at:at + 4], "<f4") + 1.0).tobytes()
    path.write_bytes(bytes(raw))  # what it serves is not what it committed to
    with pytest.raises(BadStates, match="not in the committed states root"):
        trio.run(_fetch, store, root)


def test_missing_states_or_refused_stream_fail_the_executor(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with pytest.raises(BadStates, match="does not hold"):
        trio.run(_fetch, store, b"\x01" * 32)
    with pytest.raises(BadStates, match="refused"):  # connected, but no states protocol
        trio.run(_fetch, None, b"\x01" * 32)


def test_unreachable_executor_is_not_its_fault(tmp_path: Path) -> None:
    with pytest.raises(StatesUnavailable):
        trio.run(lambda: _fetch(None, b"\x01" * 32, connected=False))


def test_store_budget_drops_oldest(tmp_path: Path) -> None:
    one = states().nbytes
    store = StateStore(tmp_path, budget_bytes=int(2.5 * one), keep_ms=0)
    roots = []
    for i in range(4):
        s = states() + i
        roots.append((bytes([i]) * 32, store.put(bytes([i]) * 32, s)[0]))
        store.flush()  # written in order, so the file times order them
    kept = [tid for tid, root in roots if entry(tmp_path, tid, root).exists()]
    assert kept == [bytes([2]) * 32, bytes([3]) * 32]
    assert len(list(tmp_path.glob("*"))) == 4  # two entries, two tombstones
    with pytest.raises(StatesMissing):
        store.leaves(*roots[0], [0])
    with pytest.raises(ValueError):
        store.put(TASK, states().astype(np.float64))


def test_states_inside_the_check_window_are_kept_over_budget_and_evicted_ones_are_no_conviction(
        tmp_path: Path) -> None:
    assert DEFAULT_KEEP_MS >= states_check_window_ms(VerifyConfig()) > 0
    one = states().nbytes
    store = StateStore(tmp_path, budget_bytes=int(1.5 * one), keep_ms=60_000)
    roots = [(bytes([i]) * 32, store.put(bytes([i]) * 32, states() + i)[0]) for i in range(3)]
    store.flush()
    assert len(list(tmp_path.glob(f"*{SUFFIX}"))) == 3  # all young: kept, over budget or not
    hour_ago = time.time() - 3600
    for tid, root in roots[:2]:  # the first two leave the check window
        os.utime(entry(tmp_path, tid, root), (hour_ago, hour_ago))
    store.put(b"\x09" * 32, states() + 9)
    store.flush()
    with pytest.raises(StatesEvicted):
        store.leaves(*roots[0], [0])
    assert store.leaves(*roots[2], [0])  # the young one is still served
    # a check arriving after the eviction is inconclusive, never the executor's failure
    with pytest.raises(StatesUnavailable, match="evicted"):
        trio.run(lambda: _fetch(store, roots[0][1], task=roots[0][0]))
    # while states never held are
    with pytest.raises(BadStates, match="does not hold"):
        trio.run(lambda: _fetch(store, b"\x05" * 32))


def test_only_states_never_held_convict() -> None:
    assert states_refusal_convicts(-1)
    assert not states_refusal_convicts(-2) and not states_refusal_convicts(-3)
    with pytest.raises(ValueError):
        states_refusal_convicts(-4)


def test_a_verifier_over_its_quota_is_turned_away_without_a_conviction(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    root, _ = store.put(TASK, states())
    limits = NetLimits(states_requests_per_peer_per_min=2)

    async def three_checks() -> None:
        async with trio.open_nursery() as nursery:
            handler = serve_states(store, limits)
            transport = MemTransport(nursery, handler)
            for _ in range(2):
                await fetch_leaves(transport, "p", "exec", TASK, root,  # type: ignore[arg-type]
                                   L, T, WANTED)
            with pytest.raises(StatesUnavailable, match="quota"):
                await fetch_leaves(transport, "p", "exec", TASK, root,  # type: ignore[arg-type]
                                   L, T, WANTED)
            nursery.cancel_scope.cancel()

    trio.run(three_checks)
    quota = StatesQuota(per_min=2, concurrent=1)
    assert quota.admit("v", 0.0) and not quota.admit("v", 1.0)  # one at a time
    quota.release("v", 2.0)
    assert quota.admit("v", 3.0) and quota.admit("w", 3.0)  # each peer its own
    quota.release("v", 4.0)
    assert not quota.admit("v", 5.0)  # two in the last minute already
    assert quota.admit("v", 61.0)  # the first one has left the minute
