"""The block server: one stage of a layer-sharded chain, serving inference sessions on streams.

A requester opens a stream of the inference protocol to this node and speaks the session
protocol (protocol/inference/messages.py) on it: any number of sessions, one request at a
time, one reply each. :class:`StageHost` keeps the rules in protocol/inference/session.py's
``SessionServer`` (admission, limits, expiry) and performs its effects: replies go back on the
stream the request came on, ``RunForward`` runs the stage in a worker thread (one computation
at a time: torch gets the cores), caches are cropped and freed. A penalty is reported through
``report`` (the service feeds it to the driver), and a stream whose bytes are no message is
the peer's fault too. A stream that stays silent for the idle timeout is closed and its
sessions freed; so is every session of a stream that ends.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import trio

from models.blocks import BlockStage, StageCache
from node.inference.wire import SessionStream, pack_hidden, unpack_hidden
from node.transport import BulkStream, FrameTooLarge, TransportError
from protocol.errors import InvalidMessage
from protocol.inference.messages import SessionAccepted, SessionOpen
from protocol.inference.session import (
    CropCache,
    ForwardDone,
    ForwardFailed,
    FreeCache,
    RunForward,
    SessionServer,
)
from protocol.machine import Effect, Emit, Penalize, Received, Send

Report = Callable[[str, str], Awaitable[None]]


class StageHost:
    """Serves ``stage`` to sessions under ``machine``'s rules (see the module docstring)."""

    def __init__(self, stage: BlockStage, machine: SessionServer, *, clock: Callable[[], int],
                 report: Report, log: object, delay_ms: float = 0.0) -> None:
        self.stage = stage
        self.machine = machine
        self.caches: dict[bytes, StageCache] = {}
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
        idle_s = max(1.0, self.machine.limits.idle_timeout_ms / 1000)
        try:
            while True:
                with trio.move_on_after(idle_s) as idle:
                    try:
                        msg = await stream.receive()
                    except InvalidMessage as exc:
                        await self._report(peer, f"undecodable session frame: {exc}")
                        return
                    except FrameTooLarge as exc:
                        await self._report(peer, f"oversized session frame: {exc}")
                        return
                    except TransportError:
                        return  # the requester closed or broke the stream: no fault
                if idle.cancelled_caught:
                    return
                if isinstance(msg, SessionOpen):
                    opened.append(msg.session_id)
                effects = self.machine.handle(Received(peer, msg), self._clock())
                if not await self._perform(peer, stream, effects):
                    return
        finally:
            await self._perform(peer, None, self.machine.close_all(peer, opened))
            await stream.close()

    async def _perform(self, peer: str, stream: SessionStream | None,
                       effects: list[Effect]) -> bool:
        """Perform ``effects``; False once the stream must end (a penalty was due)."""
        keep = True
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, Send) and stream is not None:
                if isinstance(effect.message, SessionAccepted):
                    self.caches[effect.message.session_id] = StageCache()
                try:
                    await stream.send(effect.message)
                except TransportError:
                    keep = False
            elif isinstance(effect, RunForward):
                queue.extend(await self._run(effect))
            elif isinstance(effect, CropCache):
                cache = self.caches.get(effect.session_id)
                if cache is not None:
                    cache.crop(min(effect.length, cache.length))
            elif isinstance(effect, FreeCache):
                self.caches.pop(effect.session_id, None)
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
        started = time.perf_counter()
        try:
            async with self._compute:
                out = await trio.to_thread.run_sync(
                    self.stage.forward, hidden, run.start_pos, cache, (run.start, run.end))
            data = pack_hidden(out, run.precision)
        except (ValueError, RuntimeError) as exc:  # our own compute broke: no one's penalty
            return self.machine.handle(ForwardFailed(run.session_id, False, str(exc)),
                                       self._clock())
        self.forwards += 1
        ms = int((time.perf_counter() - started) * 1000)
        return self.machine.handle(ForwardDone(run.session_id, run.start_pos, run.n, data, ms),
                                   self._clock())

    def perform_expiry(self, effects: list[Effect]) -> None:
        """Effects of an idle-timeout tick (the driver's): free the expired caches."""
        for effect in effects:
            if isinstance(effect, FreeCache):
                self.caches.pop(effect.session_id, None)
