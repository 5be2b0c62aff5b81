"""The states stream: a verifier fetches committed layer-state leaves from an executor.

One stream per check: the verifier writes a ``StatesRequest`` (task, states root, leaf
indices), the executor answers one ``StateLeaf`` frame per index from its
models.state_store.StateStore, or a single ``index = -1`` frame when it does not hold them.
:func:`fetch_leaves` checks every leaf against the root of the executor's signed commitment
(index-bound Merkle proof, header naming the layer and block asked for), so a wrong, missing
or forged leaf is the executor's failure, never a pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import numpy as np
import trio

from crypto.merkle import verify_proof
from models.layer_states import decode_leaf, leaf_index, n_blocks
from models.state_store import StatesMissing, StateStore
from node.transport import BulkStream, Transport, TransportError, read_frame, write_frame
from protocol.codec import MAX_FRAME_BYTES, decode, encode
from protocol.errors import InvalidMessage
from protocol.names import protocol_id
from protocol.verification.messages import StateLeaf, StatesRequest
from protocol.verification.rules import decode_proof

STATES_PROTOCOL_NAME = "verify-states"
#: opening the stream and each frame after it must make progress within this long
STEP_TIMEOUT_S = 10.0


def states_protocol(network_id: str) -> str:
    return protocol_id(network_id, STATES_PROTOCOL_NAME)


class StatesUnavailable(Exception):
    """The executor could not be reached at all (not provably its fault: the check is
    declined and the requester asks another verifier)."""


class BadStates(Exception):
    """The executor is reachable but did not open the leaves it committed to: refused the
    stream, broke it off, said it holds no states, or sent a leaf its root does not prove."""


def serve_states(store: StateStore) -> Callable[[str, BulkStream], Awaitable[None]]:
    """The executor side: a stream handler answering from ``store``."""

    async def serve(peer: str, stream: BulkStream) -> None:
        with trio.fail_after(STEP_TIMEOUT_S):
            req = decode(await read_frame(stream, max_bytes=MAX_FRAME_BYTES))
        if not isinstance(req, StatesRequest):
            raise TransportError(f"states stream: expected a StatesRequest, got "
                                 f"{type(req).__name__}")
        try:
            leaves = await trio.to_thread.run_sync(store.leaves, req.task_id, req.states_root,
                                                   list(req.leaves))
        except (StatesMissing, IndexError):
            await write_frame(stream, encode(StateLeaf(index=-1, leaf=b"", proof=b"")))
            return
        for index, leaf, proof in leaves:
            await write_frame(stream, encode(StateLeaf(index=index, leaf=leaf, proof=proof)))

    return serve


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
            if msg.index == -1:
                raise BadStates("does not hold the layer states it committed to")
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
