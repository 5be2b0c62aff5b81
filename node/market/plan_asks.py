"""Plan-mode asks in the daemon (``mode: "plan"``): the task service's part of the pipeline
that is not protocol.

* :func:`parse_plan_ask` checks an ask request (node/market/ask_request.py, plus ``mode`` and
  ``planners``) into a ``SubmitPlanTask``; the pipeline's machine
  (protocol/agents/planning.py ``PlanningRequester``) is the task service's machine.
* :class:`PlanChildren` performs the pipeline's ``SubmitTask``: it embeds the step's need
  text like an ask's (node/market/ask_request.py ``NeedEmbedder``) and hands the task back to
  the machine. Without an embedder the step goes out with its skill tags and text only (its
  match is then by skills), not failed.
* :func:`interrupted_plan`: a plan task open when the daemon stopped is failed at restart
  (its children, stored as tasks, resume on their own; the pipeline's memory of them is gone).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from node.market.ask_request import AskDefaults, AskError, NeedEmbedder, parse_ask
from protocol.agents.plan_runs import SubmitPlanTask
from protocol.market.events import SubmitTask
from protocol.market.messages import MAX_K

MODES = ("task", "plan")


def plan_mode(request: dict[str, Any]) -> bool:
    """Whether the request asks for plan mode; raises AskError for an unknown mode."""
    mode = request.get("mode") or "task"
    if mode not in MODES:
        raise AskError(f"mode must be one of {list(MODES)}", "mode")
    return bool(mode == "plan")


def parse_plan_ask(request: dict[str, Any], defaults: AskDefaults, planners: int,
                   task_id: bytes) -> SubmitPlanTask:
    """The ``SubmitPlanTask`` of a plan-mode ask (``planners`` unless the request names how
    many); the fields are checked as an ask's. Raises AskError."""
    ask = parse_ask({k: v for k, v in request.items() if k not in ("mode", "planners")},
                    defaults, task_id)
    if ask.history or ask.style != "cot" or ask.needs or ask.skills or ask.agent:
        raise AskError("a plan-mode ask takes a question, no history, style or need", "mode")
    wanted = request.get("planners", planners)
    if isinstance(wanted, bool) or not isinstance(wanted, int) or not 1 <= wanted <= MAX_K:
        raise AskError(f"planners must be an integer in [1, {MAX_K}]", "planners")
    return SubmitPlanTask(task_id=task_id, question=ask.question, answer_type=ask.answer_type,
                          deadline_ms=ask.deadline_ms, choices=ask.choices,
                          max_price=ask.max_price, max_tokens=ask.max_tokens, model=ask.model,
                          family=ask.family, seed=ask.seed, planners=wanted)


class PlanChildren:
    """Submits the pipeline's child tasks to the machine, their need text embedded."""

    def __init__(self, needs: NeedEmbedder, submit: Callable[[SubmitTask], Awaitable[None]],
                 log: Any) -> None:
        self.needs = needs
        self.submit = submit
        self.log = log

    async def __call__(self, event: SubmitTask) -> None:
        try:
            event = await self.needs.with_vector(event)
        except AskError as exc:
            self.log.warning("tasks.plan_step_unembedded", error=str(exc))
        await self.submit(event)


def interrupted_plan(snap: dict[str, Any], now_ms: int) -> dict[str, Any] | None:
    """A plan task's snapshot failed by a restart (None: the snapshot is not a plan's)."""
    if snap.get("mode") != "plan":
        return None
    return {**snap, "phase": "failed", "finished_at_ms": now_ms,
            "failure": "the requester restarted while the plans ran"}
