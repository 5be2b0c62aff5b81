"""HTTP routes of the task market, mounted under ``/tasks`` by the daemon's API.

* ``GET /tasks/`` (recent tasks, ``?limit=``) and ``GET /tasks/{id}``: open to local readers,
  like ``/status``.
* ``POST /tasks/``: ask the network (JSON: ``question``, ``k``, ``model``, ``family``,
  ``answer_type``, ``choices``, ``deadline_ms``, ``max_tokens``, ``wait`` (default true)).
  Answers the final snapshot (answer, vote table, every CoT with its executor), or with
  ``wait: false`` the task id at once (202). Needs the API token.
* OpenAI-compatible, token-protected (the API token is the OpenAI ``api_key``), with the
  base URL ``http://127.0.0.1:<port>/v1``, mounted at the root so existing OpenAI clients
  work unchanged: ``POST /v1/chat/completions`` routes a chat through the network (``k``
  defaults to 1; with ``k`` > 1 the content is the voted answer) and ``GET /v1/models``. Streaming
  is not supported (400). Extra request fields ``k``, ``answer_type``, ``deadline_ms``; the
  response carries the task snapshot under ``symphony``.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.api.app import require_token, token_route

#: model names that mean "any model the network serves"
ANY_MODEL = ("", "auto", "symphony", "default")
MAX_LIST = 1000


class AskError(ValueError):
    """A request to ask is malformed (the routes answer 400 with this message)."""


class TasksAccess(Protocol):
    """What the routes use of the tasks service (node/market/requester.py passes itself)."""

    def recent(self, limit: int = 50) -> list[dict[str, Any]]: ...

    def load(self, task_id: str) -> dict[str, Any] | None: ...

    async def ask(self, request: dict[str, Any], *, wait: bool = True) -> dict[str, Any]:
        """The task's snapshot; raises :class:`AskError` for a malformed request."""
        ...

    def known_models(self) -> set[str]: ...


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}},
                        status_code=status)


async def _json(request: Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


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
        snap = service.load(request.path_params["task_id"].lower())
        if snap is None:
            return _error("no such task", 404)
        return JSONResponse(snap)

    async def create_task(request: Request) -> Response:
        body = await _json(request)
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


def openai_routes(service: TasksAccess) -> list[BaseRoute]:
    """``/v1/chat/completions`` and ``/v1/models``, mounted at the API's root."""

    async def chat_completions(request: Request) -> Response:
        body = await _json(request)
        if body is None:
            return _error("the body must be a JSON object")
        if body.get("stream"):
            return _error("streaming is not supported by this node")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error("messages must be a non-empty list")
        parts = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                return _error("each message needs a string content")
            if m.get("role") in ("system", "user"):
                parts.append(m["content"])
        model = body.get("model") or ""
        ask = {"question": "\n\n".join(parts), "k": body.get("k", 1),
               "answer_type": body.get("answer_type", "text"),
               "model": "" if str(model).lower() in ANY_MODEL else model,
               "deadline_ms": body.get("deadline_ms"), "max_tokens": body.get("max_tokens")}
        try:
            snap = await service.ask(ask)
        except AskError as exc:
            return _error(str(exc))
        if snap["phase"] != "done":
            return JSONResponse({"error": {"message": f"task {snap['task_id']} "
                                           f"{snap['phase']}: {snap.get('failure', '')}",
                                           "type": "server_error"}, "symphony": snap},
                                status_code=504 if snap["phase"] != "failed" else 502)
        tokens = sum(int(r.get("tokens", 0)) for r in snap["results"])
        return JSONResponse({
            "id": f"chatcmpl-{snap['task_id']}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model or "symphony",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": best_answer_text(snap)}}],
            "usage": {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens},
            "symphony": snap,
        })

    async def list_models(request: Request) -> Response:
        names = sorted(service.known_models())
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "symphony"} for n in names]})

    return [
        token_route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", require_token(list_models), methods=["GET"]),
    ]
