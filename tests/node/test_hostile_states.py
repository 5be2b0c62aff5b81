"""A hostile peer on the verification-states stream past its quota: the executor still reads
what it sent, so bytes that are no request cost the peer points (the guard penalizes what the
handler raises) instead of being answered "busy" unread, for free; a valid request past the
quota is told "busy" as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from models.state_store import StateStore
from node.runtime.limits import NetLimits
from node.transport import read_frame, write_frame
from node.verification.state_streams import STATES_BUSY, STATES_NOT_HELD, serve_states
from protocol.codec import decode, encode
from protocol.errors import InvalidMessage
from protocol.verification.messages import StateLeaf, StatesRequest
from tests.node.mem_streams import MemStream, Pipe

REQUEST = encode(StatesRequest(task_id=b"\x01" * 32, states_root=b"\x02" * 32, leaves=(0,)))


async def _ask(handler: object, frame: bytes) -> int:
    """Send ``frame`` on a fresh stream to ``handler``; the index of its one answer frame."""
    to_server, to_client = Pipe(), Pipe()
    client = MemStream(to_client, to_server, "exec")
    await write_frame(client, frame)
    await client.close()
    await handler("verifier", MemStream(to_server, to_client, "verifier"))  # type: ignore[operator]
    answer = decode(await read_frame(client, max_bytes=1 << 20))
    assert isinstance(answer, StateLeaf)
    return answer.index


def test_garbage_past_the_states_quota_is_still_the_peers_fault(tmp_path: Path) -> None:
    handler = serve_states(StateStore(tmp_path), NetLimits(states_requests_per_peer_per_min=1))

    async def main() -> None:
        with trio.fail_after(10):
            assert await _ask(handler, REQUEST) == STATES_NOT_HELD  # within the quota
            with pytest.raises(InvalidMessage):
                await _ask(handler, b"\xc1 no msgpack")  # past it: read and refused
            assert await _ask(handler, REQUEST) == STATES_BUSY

    trio.run(main)
