"""Following a plan-mode task as its steps complete (the OpenAI stream's progress lines).

The pipeline (protocol/agents/pipeline.py) emits ``PlanUpdated`` with the task's whole
snapshot whenever a plan arrives, a step completes or fails, a planner is replaced or the
vote ends it; the tasks service stores it and hands it to :meth:`LivePlans.update`, which
keeps the latest snapshot of each of the last ``MAX_FOLLOWED`` plan tasks and wakes their
followers. :meth:`LivePlans.follow` yields each new snapshot until the task is over.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import trio

#: plan tasks whose latest snapshot is kept for followers
MAX_FOLLOWED = 64
OPEN = ("bidding", "running")


class LivePlans:
    def __init__(self) -> None:
        self._snaps: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._changed: dict[str, trio.Event] = {}

    def update(self, snap: dict[str, Any]) -> None:
        """A task's snapshot was stored: keep it if it is a plan task's, wake its followers."""
        if snap.get("mode") != "plan":
            return
        task_id = str(snap["task_id"])
        self._snaps[task_id] = snap
        self._snaps.move_to_end(task_id)
        while len(self._snaps) > MAX_FOLLOWED:
            self._snaps.popitem(last=False)
        changed = self._changed.pop(task_id, None)
        if changed is not None:
            changed.set()

    async def follow(self, task_id: str) -> AsyncIterator[dict[str, Any]]:
        """Plan task ``task_id``'s snapshot now and each time it changes, until it is over
        (nothing: no plan task of that id is followed)."""
        seen: dict[str, Any] | None = None
        while True:
            changed = self._changed.setdefault(task_id, trio.Event())
            snap = self._snaps.get(task_id)
            if snap is None:
                self._changed.pop(task_id, None)
                return
            if snap is not seen:
                seen = snap
                yield snap
                continue
            if snap["phase"] not in OPEN:
                self._changed.pop(task_id, None)
                return
            await changed.wait()
