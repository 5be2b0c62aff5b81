"""The requester's side of a chain: sessions on every hop, hidden states through them, recovery.

:class:`Chain` (async, in the daemon's trio loop) plans a chain with
protocol.inference.routing.plan_chain over the servers a :class:`Directory` lists (the
ledger's block offers) and opens one session per hop on a stream of its own. A step then runs
one of two ways:

* **forwarded** (``forwarding``, the default, for chains of two hops or more): the requester
  sends its hidden states to the first hop only; each stage hands its output off to the next
  (sessions are opened with their upstream and next hop) and the last one answers: N + 1 links
  a step. Every hop's stream is read at once (node.inference.hops.Inbox): a stage may report
  a failure (its compute, its handoff) or a bad handoff it got, with the signed frame as evidence
  (protocol.inference.forwarding judges who is to blame). A step that gets no answer within
  ``STEP_TIMEOUT_S`` is run again the direct way, which shows which hop stalls.
* **direct**: the requester sends to each hop in turn and gets its output back (2 N links).

The chain keeps the first hop's inputs (exactly the values the server saw, decoded), and any
other hop's while it sees them (direct steps, replays). When a hop fails (its stream breaks,
it refuses, it answers or hands off malformed hidden states, it times out) the chain excludes
that server (reported to the penalty book when it sent bad data), plans the failed span again
among the others, rebuilds the replacement's inputs (the hops before it replay the kept
history the direct way, from the last hop whose inputs are known), replays them through the
replacement(s), links the hops on either side to it and repeats the step, so the output is
the same as without the failure.

:class:`ChainTarget` is the synchronous ``models.blocks.Target`` over a Chain for a decoding
loop in a worker thread (each call hops back into the trio loop). Rollback is lazy: the next
Forward starts below the servers' cached length, which rolls them back for free.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import trio

from models.blocks import Head
from node.inference.hops import (
    ChainError,
    Directory,
    HopFailed,
    HopSession,
    Inbox,
    Stalled,
    judge,
)
from node.inference.wire import pack_hidden, unpack_hidden
from node.transport import TransportError
from protocol.codec import Message
from protocol.errors import InvalidMessage
from protocol.inference.messages import (
    Forward,
    ForwardResult,
    HandoffRejected,
    Precision,
    Refusal,
    Relink,
    SessionAccepted,
    SessionAck,
    SessionClose,
    SessionError,
    SessionOpen,
    SessionRefused,
    max_positions_per_frame,
)
from protocol.inference.routing import Hop, NoRoute, plan_chain
from protocol.inference.stage_checks import check_nonce_hash

__all__ = ["Chain", "ChainError", "ChainTarget", "Directory", "HopFailed"]

#: one round trip of one hop (open, or a forward of up to a frame of positions), or one
#: forwarded step through the whole chain, within this
STEP_TIMEOUT_S = 60.0
#: a forwarded step with no answer nor failure report this long is run the direct way
FORWARD_STALL_S = 20.0
#: failed hops replaced within one step before the step gives up
MAX_RECOVERIES = 4
_NO_NEXT = ("", b"")


@dataclass
class Chain:
    directory: Directory
    model: str
    n_blocks: int
    hidden_size: int
    max_length: int
    kv_bytes_per_block: int  # K/V bytes a position costs in one block (stage_checks)
    precision: Precision = Precision.FP16
    #: stage-to-stage forwarding (N + 1 links a step) rather than direct (2 N)
    forwarding: bool = True
    #: every link of this chain's sessions held this long (an emulated link; 0 = off)
    link_delay_ms: int = 0
    hops: list[HopSession] = field(default_factory=list)
    excluded: set[str] = field(default_factory=set)
    recoveries: int = 0
    length: int = 0
    #: why hops failed, in order ("<peer>: <what>")
    failures: list[str] = field(default_factory=list)
    #: the forwarded step running: (its number, start position, positions)
    step: tuple[int, int, int] = (0, 0, 0)
    inbox: Inbox | None = None
    #: steps numbered so far; the nonce whose hash seeds which are checked (stage_checks)
    steps: int = 0
    nonce: bytes = field(default_factory=lambda: os.urandom(32))

    @property
    def route(self) -> list[tuple[str, int, int]]:
        return [(h.hop.peer, h.hop.start, h.hop.end) for h in self.hops]

    async def open(self) -> None:
        if self.directory.spawn is None:
            raise ChainError("a chain needs a nursery for its streams' readers")
        self.inbox = Inbox(self.directory.spawn)
        self.hops = await self._open_span(0, self.n_blocks, self._empty(), "", _NO_NEXT)

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self.hidden_size), np.float32)

    # ------------------------------------------------------------ opening hops

    async def _open_span(self, start: int, end: int, history: np.ndarray, upstream: str,
                         after: tuple[str, bytes]) -> list[HopSession]:
        """Sessions covering [start, end), linked from ``upstream`` on to ``after``, their
        caches filled by replaying ``history`` (their first hop's inputs)."""
        while True:
            try:
                plan = plan_chain(self.directory.servers(), self.model, start, end,
                                  rtt_ms=self.directory.rtt_ms(), excluded=self.excluded)
            except NoRoute as exc:
                why = "; ".join(self.failures[-3:])
                raise ChainError(f"{exc}" + (f" (failed: {why})" if why else "")) from exc
            ids = [os.urandom(16) for _ in plan]
            opened: list[HopSession] = []
            try:
                for i, hop in enumerate(plan):
                    prev = plan[i - 1].peer if i else upstream
                    nxt = (plan[i + 1].peer, ids[i + 1]) if i + 1 < len(plan) else after
                    opened.append(await self._open_hop(hop, ids[i], prev, nxt))
                x = history
                for session in opened:
                    if len(x):
                        x = await self._push(session, x, 0)
                return opened
            except HopFailed as exc:
                await self._fail(exc)
                for s in opened:
                    await self._close_hop(s)

    async def _open_hop(self, hop: Hop, sid: bytes, upstream: str,
                        nxt: tuple[str, bytes]) -> HopSession:
        if not self.forwarding:
            upstream, nxt = "", _NO_NEXT
        try:
            with trio.fail_after(STEP_TIMEOUT_S):
                stream = await self.directory.open_stream(hop.peer)
        except (TransportError, trio.TooSlowError) as exc:
            raise HopFailed(hop.peer, f"open failed: {exc!r}") from exc
        s = HopSession(hop, stream, sid, self._empty(), upstream, nxt)
        assert self.inbox is not None
        self.inbox.watch(s)
        try:
            await self._send(s, SessionOpen(
                session_id=sid, model=self.model, start=hop.start, end=hop.end,
                max_length=self.max_length, precision=self.precision,
                hidden_size=self.hidden_size, upstream=upstream, next_peer=nxt[0],
                next_session=nxt[1], link_delay_ms=self.link_delay_ms,
                check_nonce_hash=check_nonce_hash(self.nonce)))
            reply = await self._expect(s, (SessionAccepted, SessionRefused))
        except HopFailed:
            await self._close_stream(s)
            raise
        if isinstance(reply, SessionRefused):
            await self._close_stream(s)
            raise HopFailed(hop.peer, f"refused: {reply.reason.value} ({reply.detail})")
        return s

    async def _relink(self, s: HopSession, upstream: str, nxt: tuple[str, bytes]) -> None:
        if not self.forwarding:
            return
        await self._send(s, Relink(session_id=s.session_id, upstream=upstream,
                                   next_peer=nxt[0], next_session=nxt[1]))
        await self._expect(s, (SessionAck,))
        s.upstream, s.next = upstream, nxt

    # ------------------------------------------------------------ messages

    async def _send(self, s: HopSession, msg: Message) -> None:
        try:
            with trio.fail_after(STEP_TIMEOUT_S):
                await s.stream.send(msg)
        except (TransportError, trio.TooSlowError) as exc:
            raise HopFailed(s.peer, f"send failed: {exc!r}") from exc

    async def _expect(self, want: HopSession, kinds: tuple[type, ...], start_pos: int = -1,
                      n: int = 0, timeout_s: float = STEP_TIMEOUT_S) -> Message:
        """The next message of one of ``kinds`` from hop ``want``; any hop's failure report,
        broken stream or malformed frame raises HopFailed for the hop at fault, and a stale
        ForwardResult (of a step given up) is skipped. Nothing in time: ``Stalled``."""
        assert self.inbox is not None
        with trio.move_on_after(timeout_s) as waited:
            while True:
                s, item = await self.inbox.next()
                if isinstance(item, Exception):
                    raise HopFailed(s.peer, f"stream: {item!r}"[:300],
                                    bad_data=isinstance(item, InvalidMessage))
                if isinstance(item, HandoffRejected):
                    raise judge(s, item, self.step, self.hidden_size, self.precision)
                if isinstance(item, SessionError):
                    if item.reason is Refusal.NEXT_HOP_FAILED and s.next[0]:
                        raise HopFailed(s.next[0], f"unreachable from {s.peer[-8:]}: "
                                                   f"{item.detail}")
                    raise HopFailed(s.peer, f"{item.reason.value}: {item.detail}")
                if isinstance(item, ForwardResult) and (
                        s is not want or (item.start_pos, item.n) != (start_pos, n)):
                    continue
                if s is want and isinstance(item, kinds):
                    return item
                if s is want:
                    raise HopFailed(s.peer, f"answered a {type(item).__name__}")
        assert waited.cancelled_caught
        raise Stalled(want.peer, f"no answer in {timeout_s:g} s")

    def _result(self, s: HopSession, reply: Message, n: int) -> np.ndarray:
        assert isinstance(reply, ForwardResult)
        try:
            return unpack_hidden(reply.data, n, self.hidden_size, self.precision)
        except InvalidMessage as exc:
            raise HopFailed(s.peer, str(exc), bad_data=True) from exc

    # ------------------------------------------------------------ steps

    async def _push(self, s: HopSession, x: np.ndarray, start_pos: int) -> np.ndarray:
        """Send ``x`` (positions start_pos..) through hop ``s`` alone, answered by it."""
        per_frame = max_positions_per_frame(self.hidden_size, self.precision)
        outs = []
        for a in range(0, len(x), per_frame):
            piece = x[a:a + per_frame]
            data = pack_hidden(piece, self.precision)
            sent_at = time.perf_counter()
            self.steps += 1
            await self._send(s, Forward(session_id=s.session_id, start_pos=start_pos + a,
                                        n=len(piece), data=data, step=self.steps))
            reply = await self._expect(s, (ForwardResult,), start_pos + a, len(piece))
            assert isinstance(reply, ForwardResult)
            self.directory.observe_rtt(s.peer, (time.perf_counter() - sent_at) * 1000
                                       - reply.compute_ms)
            outs.append(self._result(s, reply, len(piece)))
            s.keep_inputs(start_pos + a,
                          unpack_hidden(data, len(piece), self.hidden_size, self.precision))
        return np.concatenate(outs) if outs else x

    async def _direct(self, x: np.ndarray, start: int) -> np.ndarray:
        for s in self.hops:
            x = await self._push(s, x, start)
        return x

    async def _forwarded(self, x: np.ndarray, start: int) -> np.ndarray:
        """``x`` into the first hop, handed off stage to stage, the output from the last."""
        per_frame = max_positions_per_frame(self.hidden_size, self.precision)
        first, last = self.hops[0], self.hops[-1]
        outs = []
        for a in range(0, len(x), per_frame):
            piece = x[a:a + per_frame]
            data = pack_hidden(piece, self.precision)
            self.steps += 1
            self.step = (self.steps, start + a, len(piece))
            await self._send(first, Forward(session_id=first.session_id, start_pos=start + a,
                                            n=len(piece), data=data, step=self.step[0],
                                            reply=False))
            first.keep_inputs(start + a,
                              unpack_hidden(data, len(piece), self.hidden_size, self.precision))
            try:
                reply = await self._expect(last, (ForwardResult,), start + a, len(piece),
                                           FORWARD_STALL_S)
            except Stalled:  # someone stalls: the direct way shows who
                outs.append(await self._direct(piece, start + a))
                continue
            outs.append(self._result(last, reply, len(piece)))
        return np.concatenate(outs)

    async def forward(self, hidden: np.ndarray, start: int) -> np.ndarray:
        """(n, C) hidden states of positions start.. through every hop -> (n, C)."""
        if start > self.length:
            raise ValueError(f"positions from {start}, the chain holds {self.length}")
        failures, pending = 0, None
        while True:
            try:
                if pending is not None:
                    await self._recover(pending, start)
                    pending = None
                if self.forwarding and len(self.hops) > 1:
                    out = await self._forwarded(hidden, start)
                else:
                    out = await self._direct(hidden, start)
                break
            except HopFailed as exc:
                failures += 1
                if failures > MAX_RECOVERIES:
                    raise ChainError(f"{failures} hop failures in one step: {exc}") from exc
                pending = exc
        self.length = start + len(hidden)
        return out

    # ------------------------------------------------------------ recovery

    async def _recover(self, exc: HopFailed, start: int) -> None:
        """Replace the hops ``exc`` names (see the module docstring)."""
        await self._fail(exc)
        bad = [i for i, s in enumerate(self.hops) if s.peer in exc.peers]
        if not bad:
            return
        i, j = min(bad), max(bad)
        for s in self.hops[i:j + 1]:
            await self._close_hop(s)
        history = await self._inputs_of(i, start)
        prev = self.hops[i - 1] if i else None
        nxt = self.hops[j + 1] if j + 1 < len(self.hops) else None
        after = (nxt.peer, nxt.session_id) if nxt is not None else _NO_NEXT
        fresh = await self._open_span(self.hops[i].hop.start, self.hops[j].hop.end, history,
                                      prev.peer if prev is not None else "", after)
        self.hops[i:j + 1] = fresh
        self.recoveries += 1
        if prev is not None:
            await self._relink(prev, prev.upstream, (fresh[0].peer, fresh[0].session_id))
        if nxt is not None:
            await self._relink(nxt, fresh[-1].peer, nxt.next)

    async def _inputs_of(self, i: int, start: int) -> np.ndarray:
        """Hop i's inputs for positions [0, start): kept, or replayed the direct way from the
        last hop before it whose inputs are known."""
        k = max(m for m in range(i + 1) if m == 0 or len(self.hops[m].inputs) >= start)
        x = self.hops[k].inputs[:start]
        for s in self.hops[k:i]:
            if len(x):
                x = await self._push(s, x, 0)
        return x

    async def _fail(self, exc: HopFailed) -> None:
        for peer in exc.peers:
            self.excluded.add(peer)
            self.failures.append(f"{peer[-8:]}: {exc.detail}"[:200])
            self.directory.on_failure(peer, exc.detail)
        if exc.bad_data:
            await self.directory.report(exc.peer, exc.detail)

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll a chain of {self.length} positions back to {length}")
        self.length = length  # the next Forward starts here; the servers crop on it

    # ------------------------------------------------------------ closing

    async def _close_hop(self, s: HopSession) -> None:
        if s.closed:
            return
        with trio.move_on_after(2):
            try:
                await s.stream.send(SessionClose(session_id=s.session_id))
                await self._expect(s, (SessionAck,))
            except (TransportError, HopFailed):
                pass
        await self._close_stream(s)

    @staticmethod
    async def _close_stream(s: HopSession) -> None:
        s.closed = True
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
