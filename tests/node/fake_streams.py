"""Stand-ins for py-libp2p's side of a guarded stream, for the guard tests: an identify stream
whose asker sends given bytes and whose reads and writes may fail, and a log that drops
everything."""

from __future__ import annotations

from typing import Any

import trio
from libp2p.network.stream.exceptions import StreamEOF

IDENTIFY = "/ipfs/id/1.0.0"


class _Conn:
    def __init__(self, peer_id: Any) -> None:
        self.peer_id = peer_id


class IdentifyStream:
    """An identify stream whose asker sends ``sent`` (then EOF) and whose writes fail with
    ``write_error`` (None: they succeed)."""

    def __init__(self, peer_id: Any, write_error: BaseException | None, sent: bytes = b"",
                 read_error: BaseException | None = None) -> None:
        self.muxed_conn = _Conn(peer_id)
        self._write_error = write_error
        self._read_error = read_error
        self._sent = sent
        self.written = b""
        self.was_reset = False

    def get_remote_address(self) -> tuple[str, int]:
        return ("127.0.0.1", 4001)

    def get_protocol(self) -> str:
        return IDENTIFY

    async def write(self, data: bytes) -> None:
        if self._write_error is not None:
            raise self._write_error
        self.written += data

    async def close(self) -> None:
        if self._write_error is not None:
            raise self._write_error

    async def read(self, n: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self._sent:
            data, self._sent = self._sent, b""
            return data
        if self._read_error is not None:
            raise self._read_error
        raise StreamEOF()

    async def reset(self) -> None:
        self.was_reset = True


class NullLog:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
