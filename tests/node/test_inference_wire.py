"""node/inference/wire.py: a session stream cuts frames out of whatever its reads return."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from node.inference.wire import READ_CHUNK, SessionStream
from node.transport import FRAME_HEADER, FrameTooLarge, TransportError
from protocol.codec import MAX_FRAME_BYTES, encode
from protocol.inference.messages import Forward, SessionClose


class Chunks:
    """A BulkStream whose reads return the given chunks in turn, then end (b"")."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.asked: list[int] = []

    @property
    def peer_id(self) -> str:
        return "peer"

    async def read(self, max_bytes: int) -> bytes:
        self.asked.append(max_bytes)
        if not self.chunks:
            return b""
        head = self.chunks.pop(0)
        assert len(head) <= max_bytes
        return head

    async def write(self, data: bytes) -> None:
        raise AssertionError("not written")

    async def close(self) -> None:
        pass

    async def reset(self) -> None:
        pass


def frames(*messages: object) -> bytes:
    return b"".join(FRAME_HEADER.pack(len(b)) + b for b in (encode(m) for m in messages))


MESSAGES = [Forward(session_id=bytes([i]) * 16, start_pos=i, n=1, data=bytes(range(i % 7)))
            for i in range(5)] + [SessionClose(session_id=b"c" * 16)]


def receive_all(stream: SessionStream, count: int) -> list[object]:
    async def main() -> list[object]:
        return [await stream.receive() for _ in range(count)]

    return trio.run(main)


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_frames_split_or_joined_across_reads_decode_the_same(cuts: list[int]) -> None:
    raw = frames(*MESSAGES)
    points = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    chunks = [raw[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]
    assert receive_all(SessionStream(Chunks(chunks)), len(MESSAGES)) == MESSAGES


def test_a_frame_that_arrived_whole_takes_one_read() -> None:
    source = Chunks([frames(*MESSAGES[:3])])
    assert receive_all(SessionStream(source), 3) == MESSAGES[:3]
    assert source.asked == [READ_CHUNK]


def test_an_oversized_frame_is_refused_before_its_body_and_a_cut_one_is_an_error() -> None:
    oversized = Chunks([FRAME_HEADER.pack(MAX_FRAME_BYTES + 1)])
    with pytest.raises(FrameTooLarge):
        receive_all(SessionStream(oversized), 1)
    assert len(oversized.asked) == 1  # the body was never waited for
    whole = frames(MESSAGES[0])
    for cut in (2, len(whole) - 1):
        with pytest.raises(TransportError, match="short of"):
            receive_all(SessionStream(Chunks([whole[:cut]])), 1)
