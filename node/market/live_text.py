"""Following a k=1 market task's text as its executor streams it (the OpenAI stream's deltas).

The requester's machine keeps what the assigned executor has streamed
(protocol/market/progress.py, ``ProgressBook``) and says when it changed (``Streamed``: it
grew, or the executor failed and its text was discarded for its replacement's);
:class:`LiveTexts` wakes the followers of that task, and each follower gets the text every
time it changes until the task is over. The text is unsigned: what the client keeps is checked
against the signed result when it comes (node/api/openai_routes.py sends the rest of the
signed text, and the machine penalizes an executor whose stream the result contradicts).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import trio


class LiveTexts:
    def __init__(self, text_of: Callable[[bytes], str | None],
                 over: Callable[[bytes], bool]) -> None:
        #: the streamed text of a task (None: none yet), and whether the task is over
        self._text_of = text_of
        self._over = over
        self._changed: dict[bytes, trio.Event] = {}

    def text(self, task_id: str) -> str | None:
        """The streamed text of task ``task_id`` (hex) so far (None: none, or a bad id)."""
        try:
            return self._text_of(bytes.fromhex(task_id))
        except ValueError:
            return None

    def poke(self, task_id: bytes) -> None:
        """The task's text grew, or the task ended: wake its followers."""
        changed = self._changed.pop(task_id, None)
        if changed is not None:
            changed.set()

    async def follow(self, task_id: bytes) -> AsyncIterator[str]:
        """The task's streamed text each time it changes, until the task is over. Each text
        extends the one before it, unless the executor streaming it failed: then the next one
        does not (``""`` once its text is discarded, then its replacement's from the start),
        and the follower drops what it had."""
        sent = ""
        while True:
            changed = self._changed.setdefault(task_id, trio.Event())
            text = self._text_of(task_id) or ""
            if text != sent:
                sent = text
                yield text
                continue
            if self._over(task_id):
                return
            await changed.wait()
