"""A test-only service that keeps gossip flowing: load for shutdown and delivery tests.

Load it into a real daemon with ``extra_services = ["tests.node.probe_service:GossipProbe"]``
(node.toml) or ``SYMPHONY_EXTRA_SERVICES``. Every ``PUBLISH_EVERY_MS`` its machine publishes
``BURST`` ``ProbeNote``s on the short topic ``probe`` and counts the notes it receives; the
counts are in ``GET /status`` under ``services.probe``.

``StuckOnShutdown`` (``tests.node.probe_service:StuckOnShutdown``) never finishes stopping,
so a test can watch the daemon force its exit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import trio

from node.service import NodeContext, Service
from protocol.codec import Message, limits, message
from protocol.machine import Effect, Event, Publish, Received, Tick

#: outside every production tag range (1-129): only processes that import this module know it
PROBE_NOTE_TAG = 250
#: 20 notes/s per node: steady traffic a few py-libp2p daemons on 2 cores carry with room
PUBLISH_EVERY_MS = 50
BURST = 1
#: how long StuckOnShutdown blocks shutdown: longer than the daemon's forced-exit deadline
STUCK_FOR_S = 60


@message(PROBE_NOTE_TAG)
@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeNote(Message):
    seq: int = limits(lo=0)
    padding: bytes = limits(max_len=1024)


class ProbeMachine:
    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self._next_at: int | None = None

    def handle(self, event: Event, now: int) -> list[Effect]:
        if isinstance(event, Received) and isinstance(event.message, ProbeNote):
            self.received += 1
            return []
        if self._next_at is None:
            self._next_at = now
        if isinstance(event, Tick) and now >= self._next_at:
            self._next_at = now + PUBLISH_EVERY_MS
            out: list[Effect] = []
            for _ in range(BURST):
                self.sent += 1
                out.append(Publish("probe", ProbeNote(seq=self.sent, padding=b"x" * 512)))
            return out
        return []

    def next_deadline(self) -> int | None:
        return self._next_at


class GossipProbe(Service):
    name: ClassVar[str] = "probe"
    message_types = (ProbeNote,)
    topics = ("probe",)

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self._machine = ProbeMachine()

    @property
    def machine(self) -> ProbeMachine:
        return self._machine

    def status(self) -> dict[str, Any]:
        return {"sent": self._machine.sent, "received": self._machine.received}


class StuckOnShutdown(Service):
    """A service whose background task ignores cancellation: the daemon must force its exit."""

    name: ClassVar[str] = "stuck"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self._machine = ProbeMachine()

    @property
    def machine(self) -> ProbeMachine:
        return self._machine

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(STUCK_FOR_S)


class FailsOnShutdown(Service):
    """A service whose background task raises while the daemon stops (as a connection torn
    down by a peer that is stopping too can): the stop is still clean, the error logged."""

    name: ClassVar[str] = "fails"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self._machine = ProbeMachine()

    @property
    def machine(self) -> ProbeMachine:
        return self._machine

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            raise RuntimeError("peer went away mid-shutdown")
