"""HTTP routes of the task market, mounted under ``/tasks`` by the daemon's API.

* ``GET /tasks/`` (recent tasks, ``?limit=``) and ``GET /tasks/{id}``: open to local readers,
  like ``/status``; an open k=1 task's also holds ``streamed``, the text its executor has
  streamed so far (unsigned, protocol/market/progress.py).
* ``POST /tasks/``: ask the network (JSON: ``question``, ``k``, ``model``, ``family``,
  ``answer_type``, ``choices``, ``deadline_ms``, ``max_tokens``, the prompt's ``style`` and
  ``history`` and the sampling ``temperature``, ``top_p``, ``seed``, ``stop``: see
  node/market/ask_request.py; ``wait`` (default true)).
  Answers the final snapshot (answer, vote table, every CoT with its executor), or with
  ``wait: false`` the task id at once (202). Needs the API token. A model no peer serves
  whole but whose blocks are all offered runs on a chain of block servers instead of the
  auction (node/market/chain_asks.py: k = 1, ``speculative`` drafts per step).
* The OpenAI-compatible routes (``/v1/...``) are node/api/openai_routes.py's.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.api.app import json_object, token_route
from node.market.ask_request import AskError
from node.market.live_text import LiveTexts

__all__ = ["AskError", "TasksAccess", "best_answer_text", "task_routes"]

MAX_LIST = 1000
OPEN_PHASES = ("bidding", "running")


class TasksAccess(Protocol):
    """What the routes use of the tasks service (node/market/requester.py passes itself)."""

    def recent(self, limit: int = 50) -> list[dict[str, Any]]: ...

    def load(self, task_id: str) -> dict[str, Any] | None: ...

    async def ask(self, request: dict[str, Any], *, wait: bool = True) -> dict[str, Any]:
        """The task's snapshot; raises :class:`AskError` for a malformed request."""
        ...

    def known_models(self) -> set[str]: ...

    #: the text k=1 tasks' executors stream (node/market/live_text.py)
    live: LiveTexts


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}},
                        status_code=status)


def best_answer_text(snap: dict[str, Any]) -> str:
    """The raw answer of the heaviest ballot for the winner (normalized forms are lossy)."""
    winner = snap.get("answer")
    if winner is None:
        return ""
    voters = [r for r in snap.get("results", []) if r.get("normalized") == winner]
    if not voters:
        return str(winner)
    return str(max(voters, key=lambda r: (r.get("weight") or 0.0, r["executor"]))["answer"])


def task_routes(service: TasksAccess) -> list[BaseRoute]:
    async def list_tasks(request: Request) -> Response:
        try:
            limit = min(MAX_LIST, max(1, int(request.query_params.get("limit", "50"))))
        except ValueError:
            return _error("limit must be an integer")
        return JSONResponse({"tasks": service.recent(limit)})

    async def show_task(request: Request) -> Response:
        task_id = request.path_params["task_id"].lower()
        snap = service.load(task_id)
        if snap is None:
            return _error("no such task", 404)
        streamed = service.live.text(task_id) if snap["phase"] in OPEN_PHASES else None
        if streamed is not None:  # a k=1 task's text so far, as its executor streams it
            snap = {**snap, "streamed": streamed}
        return JSONResponse(snap)

    async def create_task(request: Request) -> Response:
        body = await json_object(request)
        if body is None:
            return _error("the body must be a JSON object")
        wait = body.pop("wait", True)
        try:
            snap = await service.ask(body, wait=bool(wait))
        except AskError as exc:
            return _error(str(exc))
        return JSONResponse(snap, status_code=200 if wait else 202)

    return [
        Route("/", list_tasks, methods=["GET"]),
        token_route("/", create_task, methods=["POST"]),
        Route("/{task_id:str}", show_task, methods=["GET"]),
    ]
