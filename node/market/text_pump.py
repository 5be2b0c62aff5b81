"""Carries a solver thread's growing text to the executor service's trio loop.

The solver (models/solver.py, ``on_text``) calls :meth:`TextPump.push` from its worker thread
after each token; :meth:`TextPump.follow`, in the service's nursery, hands the newest text to
a sender once the frame before it has been delivered (``drained``) and at most once per
``PROGRESS_INTERVAL_S``, so a fast model's tokens, or those generated while a slow link or a
loaded machine holds a frame up, are coalesced into fewer frames (protocol/market/progress.py
bounds how many a task may send), a text pushed while a frame is on its way is not lost (the
next frame carries it), and at most one frame is ever queued ahead of the signed result.
Without the wait, each token's frame queued behind the last on the executor's outbox to the
requester, one round trip each: under load the backlog held the commitment, and the bids
for the next task, up by seconds after the generation had ended.

The gap is per executor, not per task: with ``n`` tasks streamed at once each waits ``n``
times :data:`PROGRESS_INTERVAL_S` (:func:`shared_gap`), so an executor sends at most one frame per
interval in all. Each frame costs the executor's and the requester's event loops an exchange
of its own; a batch of many tasks (models/batched.py) would otherwise spend the cores the model
decodes on, on frames that the same tokens, a moment later, would carry too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

#: the shortest gap between two progress frames of an executor's tasks (the next frame of a
#: task also waits until its last is delivered): each frame is a round trip of its own on the
#: executor's outbox
PROGRESS_INTERVAL_S = 0.04


def shared_gap(streams: int) -> float:
    """The gap between two frames of one task while ``streams`` tasks stream at once."""
    return PROGRESS_INTERVAL_S * max(1, streams)


class TextPump:
    def __init__(self, gap: Callable[[], float] = lambda: PROGRESS_INTERVAL_S) -> None:
        """Made in the trio thread that follows it. ``gap``: the shortest time between two of
        its frames, asked after each (the executor's :func:`shared_gap`)."""
        self._gap = gap
        self.text = ""
        self._changed = trio.Event()
        self._loop = trio.lowlevel.current_trio_token()

    def push(self, text: str) -> None:
        """From the solver's thread: the text generated so far. Never waits for the event
        loop, so streaming does not slow the generation down."""
        self.text = text
        try:
            self._loop.run_sync_soon(self._wake)
        except trio.RunFinishedError:  # the daemon is stopping: nobody to stream to
            pass

    def _wake(self) -> None:
        self._changed.set()

    async def follow(self, send: Callable[[str], Awaitable[None]],
                     drained: Callable[[], Awaitable[None]]) -> None:
        """Hand each new text to ``send`` until cancelled (when the solver is done), the next
        only once ``drained`` says the last one's frame has left."""
        while True:
            await self._changed.wait()
            self._changed = trio.Event()
            await send(self.text)
            await drained()
            await trio.sleep(self._gap())
