"""Asks served by a chain of block servers: a model no peer holds whole, served in parts.

The tasks service (node/market/requester.py) asks :meth:`ChainAsks.placement` where a
checked ask runs (protocol.inference.placement.place, over the ledger view: the market, a
chain, or nowhere). For a chain, :meth:`ChainAsks.ask` runs it here instead of the auction:

* the prompt is the one an executor would build for the same task (models.cot.build_prompt:
  the conversation through the model's chat template for style "chat", the raw prompt for
  "plain", the step-by-step instruction for "cot"), and the answer is read from the text as
  an executor reads it (models.cot.answer_of);
* ``max_tokens``, ``stop``, ``temperature`` (unset: greedy), ``top_p`` and ``seed`` are
  honoured by the requester's decoding (node/inference/requester.py); ``speculative`` (0..16,
  default 0) drafts that many tokens a step at most;
* one chain computes one answer, so a vote (``k`` > 1) is refused with a reason; an unset
  ``k`` is 1 here;
* the task is a snapshot like the market's (``symphony tasks show``, ``GET /tasks/{id}``, the
  OpenAI routes read it alike): one result, from the executor ``"chain"``; one attempt per hop
  of the chain that finished it; and ``chain`` (the route, recoveries, speed, acceptance) that
  the market's snapshots do not carry. A daemon restarted while a chain generated fails that
  task (:func:`interrupted`): a chain's sessions do not survive their requester;
* :meth:`ChainAsks.live_text` follows the text as the chain accepts tokens (the OpenAI
  stream's deltas); a follower that goes away stops the generation.

The generation runs in the inference service's nursery, bounded by the task's deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from node.market.ask_request import AskError
from protocol.inference.placement import Placement, Route, place, servable
from protocol.market.events import SubmitTask

#: an ask waits this much longer than its deadline for the chain's last step
ASK_GRACE_S = 5.0


class ChainRun:
    """One chain ask in progress: its latest snapshot and the text generated so far."""

    def __init__(self, snap: dict[str, Any]) -> None:
        self.snap = snap
        self.text = ""
        self.version = 0
        self.done = False
        self.cancelled = False
        self.finished = trio.Event()
        self._changed = trio.Event()

    def update(self, text: str, tokens: int) -> bool:
        """The text after ``tokens`` tokens (from the decoding thread); True: stop."""
        self.text, self.version = text, self.version + 1
        self._changed.set()
        self._changed = trio.Event()
        return self.cancelled

    def finish(self, snap: dict[str, Any]) -> None:
        self.snap, self.done = snap, True
        self._changed.set()
        self.finished.set()

    async def texts(self) -> AsyncIterator[str]:
        """The text each time it grows, until the generation ends; a follower that leaves
        early (its stream closed or cancelled) stops the generation."""
        seen = 0
        try:
            while True:
                changed = self._changed
                if self.version != seen:
                    seen = self.version
                    yield self.text
                    continue
                if self.done:
                    return
                await changed.wait()
        finally:
            if not self.done:
                self.cancelled = True


class ChainAsks:
    """Placement of asks, and the chain asks of one daemon (see the module docstring)."""

    def __init__(self, ctx: Any, record: Callable[[dict[str, Any]], None],
                 started_at_ms: int) -> None:
        self.ctx = ctx
        self.record = record
        self.started_at_ms = started_at_ms
        self.runs: dict[str, ChainRun] = {}

    def _inference(self) -> Any | None:
        service = self.ctx.services.get("inference")
        if service is None or not getattr(service, "model_name", "") or not service.running:
            return None
        return service

    def _view(self) -> Any | None:
        return getattr(getattr(self.ctx.services.get("ledger"), "machine", None), "view", None)

    def _own_models(self) -> list[str]:
        executor = self.ctx.services.get("executor")
        config = getattr(getattr(executor, "machine", None), "config", None)
        return [m.name for m in getattr(config, "models", ())]

    def _chain_models(self) -> list[str]:
        inference = self._inference()
        return [inference.model_name] if inference is not None else []

    def place(self, model: str, family: str = "") -> Placement:
        """Where a request for ``model`` runs (protocol.inference.placement.place)."""
        view = self._view()
        if view is None:  # no ledger: only this node's own executor is known
            known = model in self._own_models() or not model
            return Placement(Route.MARKET if known else Route.NOT_FOUND, model,
                             "" if known else f"The model `{model}` is not served here")
        return place(view, self.ctx.clock(), model, family=family,
                     own_models=self._own_models(), chain_models=self._chain_models())

    def model_created(self) -> dict[str, int]:
        """Each model a request may name -> when it was first offered (Unix seconds)."""
        own = {name: self.started_at_ms for name in self._own_models()}
        view = self._view()
        if view is None:
            return {name: at // 1000 for name, at in own.items()}
        offered = servable(view, self.ctx.clock(), own_models=own,
                           chain_models=self._chain_models())
        return {name: at // 1000 for name, at in offered.items()}

    def live_text(self, task_id: str) -> AsyncIterator[str] | None:
        """The text of chain task ``task_id`` as it grows (None: not a running chain task)."""
        run = self.runs.get(task_id)
        return None if run is None or run.done else run.texts()

    async def ask(self, event: SubmitTask, request: dict[str, Any], placement: Placement, *,
                  wait: bool) -> dict[str, Any]:
        """Run a checked ask on a chain of ``placement.model``; its snapshot (final when
        ``wait``)."""
        from node.market.chain_task import decoding_of, running_snapshot

        if request.get("k") not in (None, 1):
            raise AskError(
                f"k = {request['k']}: {placement.model} is served only in parts, by a chain of "
                "block servers, and a chain computes one answer; ask with k = 1 (or leave k "
                "unset) for this model", "k")
        inference = self._inference()
        if inference is None:
            raise AskError("this node's inference service is not running", "model")
        decoding = decoding_of(event, request.get("speculative"))
        assert event.task_id is not None  # parse_ask always draws one
        task_id = event.task_id.hex()
        run = self.runs[task_id] = ChainRun(running_snapshot(
            event, placement, self.ctx.clock()))
        self.record(run.snap)
        inference.start_soon(self._run, inference, run, event, placement, decoding)
        if wait:
            with trio.move_on_after(event.deadline_ms / 1000.0 + ASK_GRACE_S):
                await run.finished.wait()
        return run.snap

    async def _run(self, inference: Any, run: ChainRun, event: SubmitTask,
                   placement: Placement, decoding: Any) -> None:
        from node.market.chain_task import failed_snapshot, finished_snapshot, prompt_of

        task_id = run.snap["task_id"]
        try:
            with trio.fail_after(event.deadline_ms / 1000.0):
                requester = await inference.requester()
                ids = requester.prompt_ids(prompt_of(event))
                out = await requester.complete(ids, decoding, on_text=run.update)
            snap = finished_snapshot(run.snap, event, out, self.ctx.clock(), run.cancelled)
        except trio.TooSlowError:
            snap = failed_snapshot(run.snap, f"the deadline passed after {len(run.text)} "
                                   "characters of output", self.ctx.clock())
        except Exception as exc:  # no chain, a chain that broke: the task fails, saying why
            self.ctx.log.warning("tasks.chain_failed", task_id=task_id, error=str(exc)[:300])
            snap = failed_snapshot(run.snap, str(exc)[:500], self.ctx.clock())
        self.runs.pop(task_id, None)
        run.finish(snap)
        self.record(snap)


def interrupted(snap: dict[str, Any], now_ms: int) -> dict[str, Any] | None:
    """A stored chain task that was still open when the daemon stopped, failed (None: the
    snapshot is not a chain task's)."""
    from node.market.chain_task import failed_snapshot

    if "chain" not in snap:
        return None
    return failed_snapshot(snap, "the daemon restarted while the chain generated", now_ms)
