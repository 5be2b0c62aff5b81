"""The requester's side of a chain: sessions on every hop, hidden states through them, recovery.

:class:`Chain` (async, in the daemon's trio loop) plans a chain with
protocol.inference.routing.plan_chain over the servers a :class:`Directory` lists (the
ledger's block offers), opens one session per hop on a stream of its own and pushes hidden
states through the hops in order. It keeps, per hop, the inputs it sent (exactly the bytes the
server saw, decoded), so when a hop fails (its stream breaks, it refuses, it answers with hidden
states of the wrong shape or non-finite values) the chain

1. excludes that server (and reports it to the penalty book when it sent bad data),
2. plans the missing span [hop.start, hop.end) again among the others,
3. replays the kept inputs through the replacement hop(s) to rebuild their caches, and
4. repeats the step that failed, so the output is the same as without the failure.

:class:`ChainTarget` is the synchronous ``models.blocks.Target`` over a Chain for a decoding
loop that runs in a worker thread (``trio.to_thread.run_sync``): each call hops back into the
trio loop with ``trio.from_thread.run``. Rollback is lazy: the next Forward starts below the
servers' cached length, which rolls them back without a round trip of its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import trio

from models.blocks import Head
from node.inference.wire import SessionStream, pack_hidden, unpack_hidden
from node.transport import TransportError
from protocol.errors import InvalidMessage
from protocol.inference.messages import (
    Forward,
    ForwardResult,
    Precision,
    SessionAccepted,
    SessionClose,
    SessionOpen,
    SessionRefused,
    max_positions_per_frame,
)
from protocol.inference.routing import Hop, NoRoute, Server, plan_chain

#: one round trip of one hop (open, or a forward of up to a frame of positions) within this
STEP_TIMEOUT_S = 60.0
#: failed hops replaced within one step before the step gives up
MAX_RECOVERIES = 4


class ChainError(Exception):
    """The chain cannot go on: no server left for a span, or too many failures in a step."""


class HopFailed(Exception):
    """One hop failed; ``bad_data`` when the server sent something malformed (its fault)."""

    def __init__(self, peer: str, detail: str, *, bad_data: bool = False) -> None:
        super().__init__(f"{peer}: {detail}")
        self.peer, self.detail, self.bad_data = peer, detail, bad_data


@dataclass
class Directory:
    """What a chain needs from the daemon: the servers on offer, streams to them, penalties."""

    servers: Callable[[], list[Server]]
    open_stream: Callable[[str], Awaitable[SessionStream]]
    report: Callable[[str, str], Awaitable[None]]
    rtt_ms: Callable[[], dict[str, float]] = dict
    #: a measured round trip to a server (a hop's time minus the compute it reported)
    observe_rtt: Callable[[str, float], None] = lambda peer, ms: None
    #: a hop failed (logged by the daemon)
    on_failure: Callable[[str, str], None] = lambda peer, detail: None


@dataclass
class _HopSession:
    hop: Hop
    stream: SessionStream
    session_id: bytes
    inputs: np.ndarray  # (positions sent, C) float32: what the server has cached


@dataclass
class Chain:
    directory: Directory
    model: str
    n_blocks: int
    hidden_size: int
    max_length: int
    precision: Precision = Precision.FP16
    hops: list[_HopSession] = field(default_factory=list)
    excluded: set[str] = field(default_factory=set)
    recoveries: int = 0
    length: int = 0
    #: why hops failed, in order ("<peer>: <what>")
    failures: list[str] = field(default_factory=list)

    @property
    def route(self) -> list[tuple[str, int, int]]:
        return [(h.hop.peer, h.hop.start, h.hop.end) for h in self.hops]

    async def open(self) -> None:
        self.hops = await self._open_span(0, self.n_blocks, np.zeros((0, self.hidden_size),
                                                                     np.float32))

    async def _open_span(self, start: int, end: int, history: np.ndarray) -> list[_HopSession]:
        """Sessions covering [start, end), their caches filled by replaying ``history``."""
        while True:
            try:
                plan = plan_chain(self.directory.servers(), self.model, start, end,
                                  rtt_ms=self.directory.rtt_ms(), excluded=self.excluded)
            except NoRoute as exc:
                why = "; ".join(self.failures[-3:])
                raise ChainError(f"{exc}" + (f" (failed: {why})" if why else "")) from exc
            opened: list[_HopSession] = []
            try:
                x = history
                for hop in plan:
                    session = await self._open_hop(hop)
                    opened.append(session)
                    if len(x):
                        x = await self._push(session, x, 0)
                return opened
            except HopFailed as exc:
                await self._fail(exc)
                for s in opened:
                    await self._close_hop(s)

    async def _open_hop(self, hop: Hop) -> _HopSession:
        try:
            with trio.fail_after(STEP_TIMEOUT_S):
                stream = await self.directory.open_stream(hop.peer)
                sid = os.urandom(16)
                await stream.send(SessionOpen(
                    session_id=sid, model=self.model, start=hop.start, end=hop.end,
                    max_length=self.max_length, precision=self.precision,
                    hidden_size=self.hidden_size))
                reply = await stream.receive()
        except (TransportError, trio.TooSlowError) as exc:
            raise HopFailed(hop.peer, f"open failed: {exc!r}") from exc
        except InvalidMessage as exc:
            raise HopFailed(hop.peer, f"bad reply to open: {exc}", bad_data=True) from exc
        if not isinstance(reply, SessionAccepted) or reply.session_id != sid:
            await stream.close()
            if isinstance(reply, SessionRefused):
                raise HopFailed(hop.peer, f"refused: {reply.reason.value} ({reply.detail})")
            raise HopFailed(hop.peer, f"open answered a {type(reply).__name__}")
        return _HopSession(hop, stream, sid, np.zeros((0, self.hidden_size), np.float32))

    async def _push(self, s: _HopSession, x: np.ndarray, start_pos: int) -> np.ndarray:
        """Send ``x`` (positions start_pos..) through hop ``s``, in frame-sized pieces."""
        per_frame = max_positions_per_frame(self.hidden_size, self.precision)
        outs = []
        for a in range(0, len(x), per_frame):
            piece = x[a:a + per_frame]
            data = pack_hidden(piece, self.precision)
            outs.append(await self._round_trip(s, start_pos + a, len(piece), data))
            sent = unpack_hidden(data, len(piece), self.hidden_size, self.precision)
            s.inputs = np.concatenate([s.inputs[:start_pos + a], sent])
        return np.concatenate(outs) if outs else x

    async def _round_trip(self, s: _HopSession, start_pos: int, n: int,
                          data: bytes) -> np.ndarray:
        peer = s.hop.peer
        sent_at = time.perf_counter()
        try:
            with trio.fail_after(STEP_TIMEOUT_S):
                await s.stream.send(Forward(session_id=s.session_id, start_pos=start_pos, n=n,
                                            data=data))
                reply = await s.stream.receive()
        except (TransportError, trio.TooSlowError) as exc:
            raise HopFailed(peer, f"forward failed: {exc!r}") from exc
        except InvalidMessage as exc:
            raise HopFailed(peer, f"undecodable reply: {exc}", bad_data=True) from exc
        if not isinstance(reply, ForwardResult):
            raise HopFailed(peer, f"forward answered {reply!r}"[:300])
        if (reply.session_id, reply.start_pos, reply.n) != (s.session_id, start_pos, n):
            raise HopFailed(peer, "a result for other positions", bad_data=True)
        self.directory.observe_rtt(peer, (time.perf_counter() - sent_at) * 1000
                                   - reply.compute_ms)
        try:
            return unpack_hidden(reply.data, n, self.hidden_size, self.precision)
        except InvalidMessage as exc:
            raise HopFailed(peer, str(exc), bad_data=True) from exc

    async def forward(self, hidden: np.ndarray, start: int) -> np.ndarray:
        """(n, C) hidden states of positions start.. through every hop -> (n, C)."""
        if start > self.length:
            raise ValueError(f"positions from {start}, the chain holds {self.length}")
        i, failures = 0, 0
        x = hidden
        while i < len(self.hops):
            s = self.hops[i]
            try:
                y = await self._push(s, x, start)
            except HopFailed as exc:
                failures += 1
                if failures > MAX_RECOVERIES:
                    raise ChainError(f"{failures} hop failures in one step: {exc}") from exc
                await self._fail(exc)
                await self._close_hop(s)
                replacement = await self._open_span(s.hop.start, s.hop.end, s.inputs[:start])
                self.hops[i:i + 1] = replacement
                self.recoveries += 1
                continue
            x = y
            i += 1
        self.length = start + len(hidden)
        return x

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll a chain of {self.length} positions back to {length}")
        self.length = length  # the next Forward starts here; the servers crop on it

    async def _fail(self, exc: HopFailed) -> None:
        self.excluded.add(exc.peer)
        self.failures.append(f"{exc.peer[-8:]}: {exc.detail}"[:200])
        self.directory.on_failure(exc.peer, exc.detail)
        if exc.bad_data:
            await self.directory.report(exc.peer, exc.detail)

    async def _close_hop(self, s: _HopSession) -> None:
        with trio.move_on_after(2):
            try:
                await s.stream.send(SessionClose(session_id=s.session_id))
                await s.stream.receive()
            except (TransportError, InvalidMessage):
                pass
        await s.stream.close()

    async def close(self) -> None:
        for s in self.hops:
            await self._close_hop(s)
        self.hops = []


class ChainTarget:
    """``models.blocks.Target`` over a :class:`Chain`, called from a worker thread."""

    def __init__(self, head: Head, chain: Chain) -> None:
        self.head, self.chain = head, chain
        self.step_s: list[float] = []

    @property
    def n_vocab(self) -> int:
        return self.head.n_vocab

    def forward(self, token_ids: Sequence[int], start: int) -> np.ndarray:
        t0 = time.perf_counter()
        hidden = trio.from_thread.run(self.chain.forward, self.head.embed_tokens(token_ids),
                                      start)
        self.step_s.append(time.perf_counter() - t0)
        return self.head.logits(hidden)

    def rollback(self, length: int) -> None:
        self.chain.rollback(length)
