"""The block server: one stage of a layer-sharded chain, serving inference sessions on streams.

A requester opens a stream of the inference protocol to this node and speaks the session
protocol (protocol/inference/messages.py) on it: any number of sessions, one request at a
time, one reply each. :class:`StageHost` keeps the rules in protocol/inference/session.py's
``SessionServer`` (admission, limits, expiry) and performs its effects: replies go back on the
stream the request came on, ``RunForward`` runs the stage (one computation at a time: torch
gets the cores), caches are cropped and freed. A step of a few positions that the stage's
measured speed puts under ``INLINE_MAX_MS`` runs on the event loop itself: handing it to a
worker thread and back costs two thread wake-ups, and the one back comes right after the
compute used up this process's share of the CPU, so on shared cores it waits for a time slice:
longer than a step that short takes. Longer work (a prefill) goes to a worker
thread, so the event loop is never held long. A penalty is reported through
``report`` (the service feeds it to the driver), and a stream whose bytes are no message is
the peer's fault too. A stream that stays silent for the idle timeout is closed and its
sessions freed (unless one of them is still open: handoffs feed it, the machine expires it when
idle); so is every session of a stream that ends.

Forwarding: replies always go to the session's opener, on the stream the session was opened
on, whichever stream brought the request (a ``Handoff`` comes on the upstream stage's own
stream). ``SendHandoff`` is signed with this node's key and written on a stream of this node's
own to the next stage: one per session and next peer, opened at its first handoff (again once
if it broke) and closed with the session, so a link never outlives the receiver's idle
timeout unnoticed. A handoff that cannot be sent is reported to the machine as ``HandoffFailed``.

Stage checks: every forward also reads the K/V rows it appended out of the cache
(models.stage_kv.step_kv), which the machine logs and the signed ``StageCommit`` digests. As a
checker, the host loads a requester's committed K/V into a session's cache (``LoadKv``) and
recomputes rows on it (``RunRecheck``, models.stage_kv.recheck, on a worker thread).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial

import numpy as np
import trio

from models.blocks import BlockStage, StageCache
from models.stage_kv import kv_width, load_kv, recheck, step_kv
from node.inference.wire import SessionStream, pack_hidden, unpack_hidden
from node.transport import BulkStream, FrameTooLarge, TransportError
from protocol.errors import InvalidMessage
from protocol.inference.forwarding import HandoffFailed, SendHandoff
from protocol.inference.messages import (
    Handoff,
    SessionAccepted,
    SessionOpen,
    StageCommit,
    handoff_signing_bytes,
)
from protocol.inference.recheck import KvLoaded, LoadKv, RecheckDone, RunRecheck
from protocol.inference.session import SessionServer
from protocol.inference.session_events import (
    CropCache,
    ForwardDone,
    ForwardFailed,
    FreeCache,
    RunForward,
)
from protocol.inference.stage_checks import commit_signing_bytes
from protocol.inference.stage_log import SendCommit
from protocol.machine import Effect, Emit, Penalize, Received, Send

#: opening a stream to the next stage (a dial included) within this
LINK_TIMEOUT_S = 30.0
#: a forward of at most this many positions may run on the event loop (a decoding step, a
#: speculative draft's verification: on a CPU about one position's time, the weights are read
#: once) ...
INLINE_MAX_POSITIONS = 16
#: ... when such a forward through its blocks has been seen to take at most this long
INLINE_MAX_MS = 250.0

Report = Callable[[str, str], Awaitable[None]]
OpenStream = Callable[[str], Awaitable[SessionStream]]


class StageHost:
    """Serves ``stage`` to sessions under ``machine``'s rules (see the module docstring)."""

    def __init__(self, stage: BlockStage, machine: SessionServer, *, clock: Callable[[], int],
                 report: Report, log: object, delay_ms: float = 0.0,
                 open_stream: OpenStream | None = None,
                 sign: Callable[[bytes], bytes] | None = None,
                 ms_per_block: float = 0.0) -> None:
        self.stage = stage
        #: the fastest a forward of at most INLINE_MAX_POSITIONS took per block, ms (from the
        #: service's measurement at start, lowered by every one seen: a busy spell only ever
        #: slows one down): whether a step runs on the event loop
        self.ms_per_block = ms_per_block
        self.machine = machine
        self.caches: dict[bytes, StageCache] = {}
        #: each open session's opener stream: where its replies go
        self.openers: dict[bytes, SessionStream] = {}
        #: this node's streams to next stages, by (session, next peer)
        self.links: dict[tuple[bytes, str], SessionStream] = {}
        self._linking = trio.Lock()
        self._open_stream = open_stream
        self._sign = sign
        self._clock = clock
        self._report = report
        self._log = log
        self._compute = trio.Lock()
        self.delay_ms = delay_ms
        self.forwards = 0

    async def serve(self, peer: str, raw: BulkStream) -> None:
        """The stream handler: requests in, replies out, until the stream ends or idles."""
        stream = SessionStream(raw, self.delay_ms)
        opened: list[bytes] = []
        heard = [trio.current_time()]
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch, opened, heard, nursery.cancel_scope)
                await self._requests(peer, stream, opened, heard)
                nursery.cancel_scope.cancel()
        finally:
            await self._perform(peer, None, self.machine.close_all(peer, opened))
            await stream.close()

    async def _requests(self, peer: str, stream: SessionStream, opened: list[bytes],
                        heard: list[float]) -> None:
        while True:
            try:
                msg = await stream.receive()
            except InvalidMessage as exc:
                await self._report(peer, f"undecodable session frame: {exc}")
                return
            except FrameTooLarge as exc:
                await self._report(peer, f"oversized session frame: {exc}")
                return
            except TransportError:
                return  # the peer closed or broke the stream (or it idled): no fault
            heard[0] = trio.current_time()
            if isinstance(msg, SessionOpen):
                opened.append(msg.session_id)
            effects = self.machine.handle(Received(peer, msg), self._clock())
            if not await self._perform(peer, stream, effects):
                return

    async def _watch(self, opened: list[bytes], heard: list[float],
                     scope: trio.CancelScope) -> None:
        """End a stream silent for the idle timeout, unless a session opened on it is still
        open (handoffs feed it; the machine expires it when it idles)."""
        idle_s = max(1.0, self.machine.limits.idle_timeout_ms / 1000)
        while True:
            await trio.sleep_until(heard[0] + idle_s)
            if trio.current_time() < heard[0] + idle_s:
                continue
            if not any(sid in self.machine.sessions for sid in opened):
                scope.cancel()
                return
            heard[0] = trio.current_time()

    async def _perform(self, peer: str, stream: SessionStream | None,
                       effects: list[Effect]) -> bool:
        """Perform ``effects``; False once the stream must end (a penalty was due)."""
        keep = True
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, Send):
                sid = getattr(effect.message, "session_id", b"")
                if isinstance(effect.message, SessionAccepted) and stream is not None:
                    self.caches[sid] = StageCache()
                    self.openers[sid] = stream
                target = self.openers.get(sid, stream)
                if target is None:
                    continue
                try:
                    await target.send(effect.message, self.machine.link_delay_ms(sid))
                except TransportError:
                    keep = keep and target is not stream
            elif isinstance(effect, RunForward):
                queue.extend(await self._run(effect))
            elif isinstance(effect, LoadKv | RunRecheck):
                queue.extend(await self._checker(effect))
            elif isinstance(effect, SendHandoff):
                queue.extend(await self._hand_off(effect))
            elif isinstance(effect, SendCommit):
                queue.insert(0, Send(effect.peer, self._commit(effect)))
            elif isinstance(effect, CropCache):
                cache = self.caches.get(effect.session_id)
                if cache is not None:
                    cache.crop(min(effect.length, cache.length))
            elif isinstance(effect, FreeCache):
                self.caches.pop(effect.session_id, None)
                self.openers.pop(effect.session_id, None)
                await self._unlink(effect.session_id)
            elif isinstance(effect, Penalize):
                await self._report(effect.peer, effect.reason)
                keep = False
            elif isinstance(effect, Emit):
                self._log.info(effect.event, **effect.fields)  # type: ignore[attr-defined]
        return keep

    async def _run(self, run: RunForward) -> list[Effect]:
        cache = self.caches.get(run.session_id)
        if cache is None:
            return []
        try:
            hidden = unpack_hidden(run.data, run.n, self.stage.hidden_size, run.precision)
        except InvalidMessage as exc:
            return self.machine.handle(ForwardFailed(run.session_id, True, str(exc)),
                                       self._clock())
        forward = partial(self._forward, hidden, run, cache)
        try:
            async with self._compute:
                started = time.perf_counter()
                out, kv = forward() if self.inline(run) else await trio.to_thread.run_sync(
                    forward)
                ms = (time.perf_counter() - started) * 1000
            data = pack_hidden(out, run.precision)
        except (ValueError, RuntimeError) as exc:  # our own compute broke: no one's penalty
            return self.machine.handle(ForwardFailed(run.session_id, False, str(exc)),
                                       self._clock())
        self.forwards += 1
        if run.n <= INLINE_MAX_POSITIONS:
            self.ms_per_block = min(self.ms_per_block, ms / (run.end - run.start))
        return self.machine.handle(ForwardDone(run.session_id, run.start_pos, run.n, data,
                                               int(ms), kv), self._clock())

    def _forward(self, hidden: np.ndarray, run: RunForward, cache: StageCache,
                 ) -> tuple[np.ndarray, bytes]:
        """The stage's output for ``run`` and the K/V rows it appended (what it commits to,
        protocol.inference.recheck's layout)."""
        out = self.stage.forward(hidden, run.start_pos, cache, (run.start, run.end))
        kv = step_kv(cache, range(run.start, run.end), run.start_pos, run.n,
                     kv_width(self.stage.config))
        return out, kv.astype("<f4").tobytes()

    async def _checker(self, effect: LoadKv | RunRecheck) -> list[Effect]:
        """A checker's part of a stage check: load committed K/V into the session's cache,
        or recompute rows on it (protocol.inference.recheck). Values that are not finite are
        the requester's fault; a compute that breaks is no one's."""
        sid, blocks = effect.session_id, range(effect.start, effect.end)
        cache = self.caches.get(sid)
        if cache is None:
            return []
        width = kv_width(self.stage.config)
        try:
            if isinstance(effect, LoadKv):
                kv = np.frombuffer(effect.kv, "<f4").reshape(effect.n, len(blocks), 2, width)
                load_kv(self.stage, cache, blocks, effect.start_pos, kv)
                return self.machine.handle(KvLoaded(sid, effect.start_pos + effect.n),
                                           self._clock())
            rows = unpack_hidden(effect.data, len(effect.positions), self.stage.hidden_size,
                                 effect.precision)
        except (InvalidMessage, ValueError) as exc:
            return self.machine.handle(ForwardFailed(sid, True, str(exc)), self._clock())
        positions = np.array(effect.positions, dtype=np.int64)
        committed = step_kv(cache, blocks, 0, int(positions.max()) + 1, width)
        work = partial(recheck, self.stage, rows, positions, committed,
                       (effect.start, effect.end))
        try:
            async with self._compute:
                out, new = await trio.to_thread.run_sync(work)
        except (ValueError, RuntimeError) as exc:
            return self.machine.handle(ForwardFailed(sid, False, str(exc)), self._clock())
        return self.machine.handle(RecheckDone(sid, out.astype("<f4").tobytes(),
                                               new.astype("<f4").tobytes()), self._clock())

    def inline(self, run: RunForward) -> bool:
        """Whether ``run`` is short enough to compute on the event loop (module docstring)."""
        return (run.n <= INLINE_MAX_POSITIONS
                and self.ms_per_block * (run.end - run.start) <= INLINE_MAX_MS)

    def _commit(self, c: SendCommit) -> StageCommit:
        """The signed StageCommit of a step (stage checks: protocol.inference.stage_checks)."""
        signature = b"" if self._sign is None else self._sign(commit_signing_bytes(
            c.session_id, c.step, c.start_pos, c.n, c.input_digest, c.output_digest,
            c.kv_digest))
        return StageCommit(session_id=c.session_id, step=c.step, start_pos=c.start_pos, n=c.n,
                           input_digest=c.input_digest, output_digest=c.output_digest,
                           kv_digest=c.kv_digest, signature=signature.ljust(64, b"\0")[:64])

    async def _hand_off(self, out: SendHandoff) -> list[Effect]:
        """Sign ``out`` and send it to the next stage (a broken stream is opened again once)."""
        signature = b"" if self._sign is None else self._sign(handoff_signing_bytes(
            out.session_id, out.step, out.start_pos, out.n, out.data))
        handoff = Handoff(session_id=out.session_id, step=out.step, start_pos=out.start_pos,
                          n=out.n, data=out.data, signature=signature)
        detail = "no way to open streams to next stages"
        key = (out.from_session, out.peer)
        for _ in range(2):
            try:
                link = await self._link(key)
                await link.send(handoff, self.machine.link_delay_ms(out.from_session))
                return []
            except (TransportError, OSError, trio.TooSlowError) as exc:
                detail = f"handoff to {out.peer} failed: {exc!r}"
                dead = self.links.pop(key, None)
                if dead is not None:
                    await dead.reset()
            except LookupError as exc:
                detail = str(exc)
                break
        return self.machine.handle(HandoffFailed(out.from_session, detail[:256]), self._clock())

    async def _link(self, key: tuple[bytes, str]) -> SessionStream:
        if self._open_stream is None:
            raise LookupError("this server cannot open streams to next stages")
        async with self._linking:
            if key not in self.links:
                with trio.fail_after(LINK_TIMEOUT_S):
                    self.links[key] = await self._open_stream(key[1])
            return self.links[key]

    async def _unlink(self, session_id: bytes) -> None:
        for key in [k for k in self.links if k[0] == session_id]:
            await self.links.pop(key).close()

    async def perform_expiry(self, effects: list[Effect]) -> None:
        """Effects of an idle-timeout tick (the driver's): free the expired caches."""
        for effect in effects:
            if isinstance(effect, FreeCache):
                self.caches.pop(effect.session_id, None)
                self.openers.pop(effect.session_id, None)
                await self._unlink(effect.session_id)
