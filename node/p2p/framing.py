"""Following the frames of py-libp2p's own protocols as its handlers read them.

py-libp2p 0.8.1 reads gossipsub RPCs and identify pushes as varint-prefixed frames and pings
as fixed 32-byte frames, and drops an oversized, truncated or stalled frame quietly (or, for
a frame that is no protobuf, not at all: see guard.py). :class:`FramedReads` stands between
such a handler and its stream: every byte the handler reads passes through a small frame
parser, so this project sees what the peer did and raises :class:`PeerFault`, which none of
py-libp2p's handlers catch, and the guard penalizes it.

Deadlines: any frame, once it has started, must arrive within ``NetLimits.read_deadline_s``
(a stall), and so must a short-lived stream's first frame; between frames a stream may wait
``NetLimits.idle_timeout_s``, or forever on a long-lived stream (gossipsub's, which an honest
peer keeps open and quiet while nothing is published, and may open before it has anything to
say; the guard keeps at most ``max_gossip_streams_per_peer`` of them open per peer, a newer
one ending the oldest).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from libp2p.network.stream.exceptions import StreamEOF

from node.runtime.limits import NetLimits

#: a 64-bit unsigned varint takes at most 10 bytes
_MAX_VARINT_BYTES = 10


class PeerFault(Exception):
    """What the peer did wrong on a stream: ``kind`` names its penalty (node/penalties.py).

    ``reported`` is set once the fault has been reported (FramedReads reports its own at
    once: some of py-libp2p's handlers swallow every exception, ping's among them)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.reported = False


@dataclass(frozen=True)
class Framing:
    """How a protocol frames its messages: varint-prefixed up to ``max_frame`` bytes, or a
    fixed ``fixed_size``; ``long_lived`` streams have no idle limit between frames. ``check``,
    if given, sees each whole frame body and raises for one that is no valid message (for a
    handler that would swallow the error itself). ``max_frames_per_min`` (0: no limit) caps
    the frames one peer sends on the protocol, all its streams together (the guard keeps the
    count): past it each frame is a flood fault, so a valid ping or identify push repeated
    without end costs the peer points like any other flood."""

    max_frame: int = 0
    fixed_size: int = 0
    long_lived: bool = False
    check: Callable[[bytes], None] | None = None
    max_frames_per_min: int = 0
    #: streams one peer may hold open at once on the protocol (0: the guard's default cap)
    max_streams: int = 0


class _Parser:
    """Where the stream stands: inside a length prefix, inside a body, or between frames."""

    def __init__(self, framing: Framing, admit_frame: Callable[[], bool] | None = None) -> None:
        self._framing = framing
        self._admit_frame = admit_frame
        self._prefix = 0  # bytes of the current length prefix read so far
        self._length = 0  # the length being decoded
        self._body = 0  # body bytes still due
        self._kept = bytearray()  # the body so far, when framing.check wants it
        self.frames = 0

    @property
    def between_frames(self) -> bool:
        return self._prefix == 0 and self._body == 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._body:
                taken = min(self._body, len(view))
                if self._framing.check is not None:
                    self._kept += view[:taken]
                self._body -= taken
                view = view[taken:]
                if not self._body:
                    self._frame_done()
            elif self._framing.fixed_size:
                self._body = self._framing.fixed_size
            else:
                self._prefix_byte(view[0])
                view = view[1:]

    def _prefix_byte(self, byte: int) -> None:
        self._length |= (byte & 0x7F) << (7 * self._prefix)
        self._prefix += 1
        if byte & 0x80:
            if self._prefix >= _MAX_VARINT_BYTES:
                raise PeerFault("bad_framing", "a length prefix longer than 10 bytes")
            return
        length, self._prefix, self._length = self._length, 0, 0
        if length > self._framing.max_frame:
            raise PeerFault("oversize", f"a {length}-byte frame (limit "
                                        f"{self._framing.max_frame})")
        self._body = length
        if not length:
            self._frame_done()

    def _frame_done(self) -> None:
        self.frames += 1
        if self._admit_frame is not None and not self._admit_frame():
            raise PeerFault("flood", f"over {self._framing.max_frames_per_min} frames a minute")
        if self._framing.check is not None:
            body, self._kept = bytes(self._kept), bytearray()
            try:
                self._framing.check(body)
            except PeerFault:
                raise  # the check named the fault itself
            except Exception as exc:
                raise PeerFault("undecodable", f"{type(exc).__name__}: {exc}"[:200]) from None


class FramedReads:
    """A libp2p stream whose reads are followed frame by frame; everything else passes through.

    Raises :class:`PeerFault` for an oversized frame, a malformed length prefix, a frame
    cut short by the end of the stream, or a stall (see the module doc for the deadlines),
    after handing it to ``report``.
    """

    def __init__(self, stream: Any, framing: Framing, limits: NetLimits,
                 report: Callable[[PeerFault], None],
                 admit_frame: Callable[[], bool] | None = None) -> None:
        self._report = report
        self.faulted = False  # a fault was raised (and reported) on this stream
        self._stream = stream
        self._framing = framing
        self._parser = _Parser(framing, admit_frame)
        self._deadline_s = limits.read_deadline_s
        self._idle_s = math.inf if framing.long_lived else limits.idle_timeout_s
        self._opened_at = trio.current_time()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    @property
    def unfinished(self) -> bool:
        """A frame was started and not completed (the handler gave up on it, or the peer
        reset the stream in its middle), and no fault was reported for it already."""
        return not self._parser.between_frames and not self.faulted

    async def read(self, n: int | None = None) -> bytes:
        try:
            return await self._read(n)
        except PeerFault as fault:
            self.faulted = True
            if not fault.reported:
                fault.reported = True
                self._report(fault)
            raise

    async def _read(self, n: int | None) -> bytes:
        parser = self._parser
        if not parser.frames and parser.between_frames and not self._framing.long_lived:
            deadline = self._opened_at + self._deadline_s  # the first frame is due
        elif parser.between_frames:
            deadline = trio.current_time() + self._idle_s
        else:
            deadline = trio.current_time() + self._deadline_s
        data: bytes = b""
        with trio.move_on_at(deadline) as scope:
            try:
                data = bytes(await self._stream.read(n))
            except EOFError:
                if not parser.between_frames:
                    raise PeerFault("bad_framing", "the stream ended inside a frame") from None
                raise
        if scope.cancelled_caught:
            if parser.frames and parser.between_frames:
                # idle, not a fault: the stream is closed as if the peer had ended it
                await self._stream.reset()
                raise StreamEOF(f"no frame for {self._idle_s} s: closed")
            raise PeerFault("stall", f"no progress within {self._deadline_s} s")
        if not data and not parser.between_frames:
            raise PeerFault("bad_framing", "the stream ended inside a frame")
        parser.feed(data)
        return data
