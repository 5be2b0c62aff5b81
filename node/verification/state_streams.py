"""The states stream: a verifier fetches committed layer-state leaves from an executor.

One stream per check: the verifier writes a ``StatesRequest`` (task, states root, leaf
indices), the executor answers one ``StateLeaf`` frame per index from its
models.state_store.StateStore, or a single refusal frame (a negative index, see
protocol/verification/messages.py): it does not hold them, it evicted them (past the check
window), or the verifier is over its quota. :func:`fetch_leaves` checks every leaf against
the root of the executor's signed commitment (index-bound Merkle proof, header naming the
layer and block asked for), so a wrong, missing or forged leaf is the executor's failure,
never a pass; an eviction or a quota refusal leaves the check inconclusive
(``protocol.verification.rules.states_refusal_convicts``).

The executor serves each peer at most ``NetLimits.states_requests_per_peer_per_min``
requests a minute and ``NetLimits.states_concurrent_per_peer`` at once (:class:`StatesQuota`);
beyond that it reads the request (bytes that are no request cost the peer points, over the
quota too) and answers ``STATES_BUSY``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import numpy as np
import trio

from crypto.merkle import verify_proof
from models.layer_states import decode_leaf, leaf_index, n_blocks
from models.state_store import StatesEvicted, StatesMissing, StateStore
from node.runtime.limits import NetLimits
from node.transport import (
    BulkStream,
    ProtocolViolation,
    Transport,
    TransportError,
    read_frame,
    write_frame,
)
from protocol.codec import MAX_FRAME_BYTES, decode, encode
from protocol.errors import InvalidMessage
from protocol.names import protocol_id
from protocol.verification.messages import (
    STATES_BUSY,
    STATES_EVICTED,
    STATES_NOT_HELD,
    StateLeaf,
    StatesRequest,
)
from protocol.verification.rules import decode_proof, states_refusal_convicts

STATES_PROTOCOL_NAME = "verify-states"
#: opening the stream and each frame after it must make progress within this long
STEP_TIMEOUT_S = 10.0
#: threads reading the state store at once, all verifiers together: each thread holds on to
#: memory of its own after it is done (the allocator's per-thread arena), and a crowd of
#: requesting peers (the fuzz bench's states attack) took the daemon from 3 threads to 7+ and
#: its memory up by tens of MiB; beyond this, requests wait their turn
STORE_READERS = 4


def states_protocol(network_id: str) -> str:
    return protocol_id(network_id, STATES_PROTOCOL_NAME)


class StatesUnavailable(Exception):
    """The executor could not be reached at all, evicted the states past the check window, or
    turned this verifier away over its quota (not provably its fault: the check is declined
    and the requester asks another verifier)."""


class BadStates(Exception):
    """The executor is reachable but did not open the leaves it committed to: refused the
    stream, broke it off, said it holds no states, or sent a leaf its root does not prove."""


class StatesQuota:
    """Per peer: requests admitted in the last minute, and streams being served now."""

    def __init__(self, per_min: int, concurrent: int) -> None:
        self._per_min = per_min
        self._concurrent = concurrent
        self._recent: dict[str, deque[float]] = {}
        self._serving: dict[str, int] = {}

    def admit(self, peer: str, now_s: float) -> bool:
        recent = self._recent.setdefault(peer, deque())
        while recent and recent[0] <= now_s - 60:
            recent.popleft()
        if len(recent) >= self._per_min or self._serving.get(peer, 0) >= self._concurrent:
            return False
        recent.append(now_s)
        self._serving[peer] = self._serving.get(peer, 0) + 1
        return True

    def release(self, peer: str, now_s: float) -> None:
        self._serving[peer] -= 1
        if not self._serving[peer]:
            del self._serving[peer]
        for other in [p for p, times in self._recent.items()
                      if not times or times[-1] <= now_s - 60]:
            del self._recent[other]  # idle for a minute: nothing left to count


def serve_states(store: StateStore, limits: NetLimits | None = None
                 ) -> Callable[[str, BulkStream], Awaitable[None]]:
    """The executor side: a stream handler answering from ``store`` within the quota."""
    limits = NetLimits() if limits is None else limits
    quota = StatesQuota(limits.states_requests_per_peer_per_min, limits.states_concurrent_per_peer)
    readers = trio.CapacityLimiter(STORE_READERS)

    async def serve(peer: str, stream: BulkStream) -> None:
        if not quota.admit(peer, trio.current_time()):
            # read all the same: past the quota, bytes that are no request would be free
            await _request(stream)
            await write_frame(stream, encode(StateLeaf(index=STATES_BUSY, leaf=b"", proof=b"")))
            return
        try:
            await _answer(store, stream, readers)
        finally:
            quota.release(peer, trio.current_time())

    return serve


async def _request(stream: BulkStream) -> StatesRequest:
    with trio.fail_after(STEP_TIMEOUT_S):
        req = decode(await read_frame(stream, max_bytes=MAX_FRAME_BYTES))
    if not isinstance(req, StatesRequest):
        raise ProtocolViolation(f"states stream: expected a StatesRequest, got "
                                f"{type(req).__name__}")
    return req


async def _answer(store: StateStore, stream: BulkStream, readers: trio.CapacityLimiter) -> None:
    req = await _request(stream)
    try:
        leaves = await trio.to_thread.run_sync(store.leaves, req.task_id, req.states_root,
                                               list(req.leaves), limiter=readers)
    except StatesEvicted:
        await write_frame(stream, encode(StateLeaf(index=STATES_EVICTED, leaf=b"", proof=b"")))
        return
    except (StatesMissing, IndexError):
        await write_frame(stream, encode(StateLeaf(index=STATES_NOT_HELD, leaf=b"", proof=b"")))
        return
    for index, leaf, proof in leaves:
        await write_frame(stream, encode(StateLeaf(index=index, leaf=leaf, proof=proof)))


def open_leaf(states_root: bytes, count: int, index: int, expected: tuple[int, int],
              leaf: bytes, proof: bytes) -> np.ndarray:
    """The rows of leaf ``index`` of ``count``, proven under ``states_root`` and labelled
    ``expected`` (layer, block); BadStates otherwise."""
    try:
        steps = decode_proof(proof)
        layer, block, arr = decode_leaf(leaf)
    except ValueError as exc:
        raise BadStates(f"leaf {index}: {exc}") from exc
    if (layer, block) != expected:
        raise BadStates(f"leaf {index} is labelled layer {layer} block {block}")
    if not verify_proof(states_root, leaf, steps, index=index, count=count):
        raise BadStates(f"leaf {index} is not in the committed states root")
    return arr


async def fetch_leaves(transport: Transport, protocol: str, executor: str, task_id: bytes,
                       states_root: bytes, layers: int, total_tokens: int,
                       wanted: Sequence[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
    """The (layer, block) leaves ``wanted``, each proven against ``states_root``."""
    blocks = n_blocks(total_tokens)
    index_of = {leaf_index(layer, block, blocks): (layer, block) for layer, block in wanted}
    count = layers * blocks
    if any(not 1 <= la <= layers or not 0 <= b < blocks for la, b in wanted):
        raise BadStates(f"asked leaves outside {layers} layers x {blocks} blocks")
    try:
        with trio.fail_after(STEP_TIMEOUT_S):
            stream = await transport.open_stream(executor, protocol)
    except (TransportError, trio.TooSlowError) as exc:
        if executor in transport.connected_peers():  # reachable, but will not open them
            raise BadStates(f"refused the states stream: {exc}") from exc
        raise StatesUnavailable(f"cannot open the states stream: {exc}") from exc
    got: dict[tuple[int, int], np.ndarray] = {}
    try:
        await write_frame(stream, encode(StatesRequest(task_id=task_id, states_root=states_root,
                                                       leaves=tuple(sorted(index_of)))))
        for index in sorted(index_of):
            with trio.fail_after(STEP_TIMEOUT_S):
                frame = await read_frame(stream, max_bytes=MAX_FRAME_BYTES)
            msg = decode(frame)
            if not isinstance(msg, StateLeaf):
                raise BadStates(f"sent a {type(msg).__name__} instead of a state leaf")
            if msg.index < 0 and states_refusal_convicts(msg.index):
                raise BadStates("does not hold the layer states it committed to")
            if msg.index < 0:  # evicted past the check window, or we are over its quota
                raise StatesUnavailable("declined to open its states: " + (
                    "evicted" if msg.index == STATES_EVICTED else "over the per-peer quota"))
            if msg.index != index:
                raise BadStates(f"sent leaf {msg.index} when {index} was due")
            got[index_of[index]] = open_leaf(states_root, count, index, index_of[index],
                                             msg.leaf, msg.proof)
    except InvalidMessage as exc:
        raise BadStates(f"malformed states frame: {exc}") from exc
    except (TransportError, trio.TooSlowError) as exc:  # it answered, then stopped short
        raise BadStates(f"states stream broke off: {exc}") from exc
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.close()
    return got
