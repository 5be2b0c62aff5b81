"""Gossip publishes for the driver: one bounded queue, published in order, best effort.

``enqueue`` never waits: a publish that finds the queue full (``PUBLISH_QUEUE_SIZE``) is
dropped, counted in ``counters["publish_dropped"]`` and logged at most once per
``DROP_LOG_INTERVAL_MS`` with the running total, so a flood of drops is one line, not a flood.
``run`` publishes what is queued on the transport; a publish the transport fails is counted
the same way. Topics are given short (``"ledger"``) and published on ``names.topic(net, short)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from node.transport import TransportError
from protocol.codec import Message, encode
from protocol.names import topic

#: Gossip publishes waiting; beyond it they are dropped and logged (gossip is best effort).
PUBLISH_QUEUE_SIZE = 1024
#: A full publish queue is logged at most this often (with the running total).
DROP_LOG_INTERVAL_MS = 1000


class PublishQueue:
    def __init__(self, transport: Any, network_id: str, *, counters: dict[str, int], log: Any,
                 now_ms: Callable[[], int]) -> None:
        self._transport = transport
        self._network_id = network_id
        self._counters = counters
        self._log = log
        self._now_ms = now_ms
        self._drop_logged_ms = -DROP_LOG_INTERVAL_MS
        # Bounded (see PUBLISH_QUEUE_SIZE): a publish never blocks a machine's effects.
        self._send, self._receive = trio.open_memory_channel[tuple[str, bytes]](
            PUBLISH_QUEUE_SIZE)

    def enqueue(self, short: str, message: Message) -> None:
        try:
            self._send.send_nowait((topic(self._network_id, short), encode(message)))
        except trio.WouldBlock:
            self._counters["publish_dropped"] += 1
            now = self._now_ms()
            if now - self._drop_logged_ms >= DROP_LOG_INTERVAL_MS:  # one line, not a flood
                self._drop_logged_ms = now
                self._log.warning("driver.publish_dropped", topic=short,
                                  message=type(message).__name__,
                                  dropped_total=self._counters["publish_dropped"])

    async def run(self) -> None:
        async for full, data in self._receive:
            try:
                await self._transport.publish(full, data)
                self._counters["published"] += 1
            except TransportError as exc:
                self._counters["publish_dropped"] += 1
                self._log.warning("driver.publish_failed", topic=full, error=str(exc))
