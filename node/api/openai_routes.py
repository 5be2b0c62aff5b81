"""The OpenAI-compatible API, mounted at the daemon API's root (base URL
``http://127.0.0.1:<port>/v1``, the API token as the ``api_key``).

* ``POST /v1/chat/completions`` and ``POST /v1/completions`` route a chat or a plain prompt
  through the network as one task (node/api/openai_request.py says which parameters are
  honoured and which are refused, and the ``symphony`` extension: ``k`` executors that vote,
  an answer type). The reply is OpenAI's object with real token counts (``usage``: every
  executor's prompt and generated tokens), ``finish_reason`` "length" when ``max_tokens`` cut
  the chosen answer, ``created`` the request's time, and the task's snapshot (the vote
  table, every executor's answer and chain of thought) under the extension field
  ``symphony``. With k = 1 the content is the model's reply; with a vote it is the chain of
  thought of the heaviest executor behind the voted answer (which ends in it).
* A model no peer serves whole but whose blocks the ledger's block offers all cover runs on a
  chain of block servers (node/market/chain_asks.py; the choice is
  protocol.inference.placement.place): the same prompt an executor would read, the same
  sampling, one result from the executor ``"chain"``, and the chain used, its speed and
  recoveries under ``symphony.chain``. A vote (k > 1) over a chain is a 400.
* ``stream: true`` answers server-sent events: a first chunk with the assistant role at once,
  then the content: on a chain token by token as the chain accepts them (text that may still
  become a stop string, or an incomplete UTF-8 character, is held back until it is decided);
  from the market, with one executor (k = 1), as that executor streams them across the
  network (unsigned progress frames, protocol/market/progress.py), the rest of the signed
  result's text once it is in; a vote streams the chosen answer once voting is done; then a
  chunk with ``finish_reason``, with ``stream_options.include_usage`` a last chunk holding
  ``usage`` (and ``symphony``), then ``data: [DONE]``. A task that fails mid-stream sends
  OpenAI's error object as an event instead.
* Plan mode (``"symphony": {"mode": "plan", "planners": n}``, protocol/agents/pipeline.py):
  the content is the answer voted over the plans. Streamed, the content is the plan's
  progress as it happens, one line per event (a plan received, a step completed with the
  agent and executor that ran it and its output, a planner replaced, a plan failed:
  node/api/openai_plans.py), then ``answer: <the voted answer>``, then the usual last
  chunks. ``usage`` counts nothing for a plan task (its steps are tasks of their own).
* ``GET /v1/models``: the models this node or a live ledger peer serves, whole or in parts that
  a chain can use, ``created`` when the oldest live offer of each was signed; then the
  network's agents (every name on a live agent card in the ledger, ``owned_by``
  "symphony-agent", ``created`` when the oldest live record naming it was signed). The id of
  an agent is its name. Names are resolved so: a model and an agent of the same name is
  listed once, as the model, and ``model: <name>`` asks for the model (name the agent with
  the extension's ``"symphony": {"agent": ...}``); agents of one name on several nodes are
  listed once, and ``model: <agent name>`` lets any of them bid (the market chooses among
  them as among executors: match, reputation, the selector).
* Every error, including a missing token (401), an unknown model (404 ``model_not_found``, at
  once, from the ledger) and an unknown path or method under ``/v1``, is OpenAI's error
  object ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from node.api.app import json_object
from node.api.openai_plans import PlanProgress
from node.api.openai_request import (
    OpenAIError,
    Parsed,
    Place,
    chat_request,
    completion_request,
)
from node.market.ask_request import AskError
from node.market.live_plans import LivePlans
from protocol.inference.placement import Placement


class ChatService(Protocol):
    """What the routes use of the tasks service (node/market/requester.py)."""

    async def ask(self, request: dict[str, Any], *, wait: bool = True) -> dict[str, Any]: ...

    async def wait_done(self, task_id: str) -> dict[str, Any]: ...

    def place(self, model: str) -> Placement: ...

    def model_created(self) -> dict[str, int]: ...

    def agent_created(self) -> dict[str, int]: ...

    def live_text(self, task_id: str) -> AsyncIterator[str] | None:
        """A running task's text as it grows: a chain's, or a k=1 market task's as its
        executor streams it (None: neither)."""
        ...

    @property
    def plans_live(self) -> LivePlans:
        """Plan-mode tasks' snapshots as their steps complete."""
        ...


def _error(exc: OpenAIError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status)


def _task_error(snap: dict[str, Any]) -> OpenAIError:
    if snap["phase"] == "failed":
        return OpenAIError(f"task {snap['task_id']} failed: {snap.get('failure') or '?'}",
                           status=502, kind="server_error", code="task_failed")
    return OpenAIError(f"task {snap['task_id']} is still {snap['phase']} after its deadline",
                       status=504, kind="server_error", code="timeout")


def chosen_result(snap: dict[str, Any]) -> dict[str, Any] | None:
    """The result shown: the heaviest ballot for the voted answer (any result, if none)."""
    results = snap.get("results") or []
    voters = [r for r in results if r.get("normalized") == snap.get("answer")]
    pool = voters or results
    return max(pool, key=lambda r: (r.get("weight") or 0.0, r["executor"])) if pool else None


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the first stop string it holds, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def _reply(snap: dict[str, Any], parsed: Parsed) -> tuple[str, str, str]:
    """(content, finish_reason, the serving model's name) of a finished task."""
    if snap.get("mode") == "plan":  # the answer voted over the plans
        return str(snap.get("answer") or ""), "stop", parsed.model or "symphony"
    result = chosen_result(snap)
    if result is None:
        return "", "stop", parsed.model or "symphony"
    text, stopped = cut_at_stop(result["cot"], parsed.stop)
    reason = "stop" if stopped else str(result.get("finish_reason") or "stop")
    served = next((a["model"] for a in snap.get("attempts", [])
                   if a["attempt"] == result["attempt"]), parsed.model or "symphony")
    return text, reason, served


def usage(snap: dict[str, Any]) -> dict[str, int]:
    """Tokens every executor of the task read and generated."""
    prompt = sum(int(r.get("prompt_tokens") or 0) for r in snap.get("results", []))
    completion = sum(int(r.get("tokens") or 0) for r in snap.get("results", []))
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def streamable(text: str, stop: tuple[str, ...]) -> str:
    """What of a growing ``text`` can be sent already: up to the first stop string it holds;
    without one, less any ending that may yet grow into a stop string, and less a trailing
    replacement character (an incomplete UTF-8 sequence, completed by the next token)."""
    cut, stopped = cut_at_stop(text, stop)
    if stopped:
        return cut
    held = max((n for s in stop for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
    text = text[:len(text) - held]
    return text.rstrip("\ufffd")


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class _Kind:
    """The shapes of one endpoint's replies: chat ("message"/"delta") or text completion."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.prefix = "chatcmpl-" if chat else "cmpl-"
        self.obj = "chat.completion" if chat else "text_completion"
        self.chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def choice(self, text: str, reason: str | None) -> dict[str, Any]:
        if self.chat:
            return {"index": 0, "message": {"role": "assistant", "content": text},
                    "logprobs": None, "finish_reason": reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    def delta(self, text: str | None, reason: str | None, first: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}


def _whole(kind: _Kind, snap: dict[str, Any], parsed: Parsed, created: int) -> Response:
    if snap["phase"] != "done":
        exc = _task_error(snap)
        return JSONResponse({**exc.body(), "symphony": snap}, status_code=exc.status)
    text, reason, served = _reply(snap, parsed)
    return JSONResponse({"id": kind.prefix + snap["task_id"], "object": kind.obj,
                         "created": created, "model": served, "system_fingerprint": None,
                         "choices": [kind.choice(text, reason)], "usage": usage(snap),
                         "symphony": snap})


async def _stream(kind: _Kind, service: ChatService, snap: dict[str, Any], parsed: Parsed,
                  created: int) -> AsyncIterator[str]:
    head = {"id": kind.prefix + snap["task_id"], "object": kind.chunk_obj, "created": created,
            "model": parsed.model or "symphony", "system_fingerprint": None}
    extra: dict[str, Any] = {"usage": None} if parsed.include_usage else {}
    yield _sse({**head, "choices": [kind.delta(None, None, first=True)], **extra})
    if snap.get("mode") == "plan":
        async for event in _plan_stream(kind, service, snap, head, extra):
            yield event
        return
    sent = ""
    live = service.live_text(snap["task_id"])
    if live is not None:  # a chain's or a k=1 task's text as it grows
        async for grown in live:
            ready = streamable(grown, parsed.stop)
            if not ready.startswith(sent):  # its executor failed: the replacement starts over
                yield _sse(_restarted(head, sent))
                sent = ""
            if len(ready) > len(sent):
                yield _sse({**head, "choices": [kind.delta(ready[len(sent):], None)], **extra})
                sent = ready
    snap = await service.wait_done(snap["task_id"])
    if snap["phase"] != "done":
        yield _sse({**_task_error(snap).body(), "symphony": snap})
        return
    text, reason, head["model"] = _reply(snap, parsed)
    if not text.startswith(sent):  # the answer is not the streamed text's continuation
        yield _sse(_restarted(head, sent))
        sent = ""
    if len(text) > len(sent):
        yield _sse({**head, "choices": [kind.delta(text[len(sent):], None)], **extra})
    last = {**head, "choices": [kind.delta(None, reason)], **extra}
    if parsed.include_usage:
        yield _sse(last)
        last = {**head, "choices": [], "usage": usage(snap)}
    yield _sse({**last, "symphony": snap})
    yield _sse("[DONE]")


def _restarted(head: dict[str, Any], sent: str) -> dict[str, Any]:
    """The chunk that tells the client to discard the ``sent`` text: the executor streaming
    it failed mid-answer and the text that follows is its replacement's, from the start."""
    return {**head, "choices": [], "symphony": {"stream_restarted": True,
                                                "discarded_chars": len(sent)}}


async def _plan_stream(kind: _Kind, service: ChatService, snap: dict[str, Any],
                       head: dict[str, Any], extra: dict[str, Any]) -> AsyncIterator[str]:
    """A plan task's stream after the role chunk: a line per plan received and per step
    completed (node/api/openai_plans.py) as they happen, then ``answer: <voted answer>``."""
    progress = PlanProgress()
    async for now in service.plans_live.follow(snap["task_id"]):
        for line in progress.lines(now):
            yield _sse({**head, "choices": [kind.delta(line, None)], **extra})
    snap = await service.wait_done(snap["task_id"])
    for line in progress.lines(snap):  # what the last update showed, if it was missed
        yield _sse({**head, "choices": [kind.delta(line, None)], **extra})
    if snap["phase"] != "done":
        yield _sse({**_task_error(snap).body(), "symphony": snap})
        return
    yield _sse({**head, "choices": [kind.delta(progress.answer_line(snap), None)], **extra})
    last = {**head, "choices": [kind.delta(None, "stop")], **extra}
    if extra:  # include_usage
        yield _sse(last)
        last = {**head, "choices": [], "usage": usage(snap)}
    yield _sse({**last, "symphony": snap})
    yield _sse("[DONE]")


def _guarded(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """The API token as the OpenAI key; a missing or wrong one is a 401 error object."""

    async def guarded(request: Request) -> Response:
        expected: str = request.app.state.api_token
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(),
                                                                  expected.encode()):
            return _error(OpenAIError("missing or wrong API key (the node's API token, in "
                                      "<data-dir>/api.token)", status=401,
                                      code="invalid_api_key"))
        try:
            response: Response = await endpoint(request)
        except OpenAIError as exc:
            return _error(exc)
        return response

    return guarded


async def _body(request: Request) -> dict[str, Any]:
    body = await json_object(request)
    if body is None:
        raise OpenAIError("the body must be a JSON object")
    return body


def openai_routes(service: ChatService) -> list[BaseRoute]:
    """The ``/v1`` routes, mounted at the API's root."""

    async def complete(request: Request, kind: _Kind,
                       parse: Callable[[dict[str, Any], Place, AbstractSet[str]], Parsed]
                       ) -> Response:
        created = int(time.time())
        parsed = parse(await _body(request), service.place, service.agent_created().keys())
        try:
            snap = await service.ask(parsed.ask, wait=not parsed.stream)
        except AskError as exc:
            raise OpenAIError(str(exc), param=exc.param) from None
        if parsed.stream:
            return StreamingResponse(_stream(kind, service, snap, parsed, created),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return _whole(kind, snap, parsed, created)

    async def chat(request: Request) -> Response:
        return await complete(request, _Kind(chat=True), chat_request)

    async def completions(request: Request) -> Response:
        return await complete(request, _Kind(chat=False), completion_request)

    async def models(request: Request) -> Response:
        models = service.model_created()
        agents = {n: at for n, at in service.agent_created().items() if n not in models}
        return JSONResponse({"object": "list", "data": [
            *({"id": name, "object": "model", "created": at, "owned_by": "symphony"}
              for name, at in sorted(models.items())),
            *({"id": name, "object": "model", "created": at, "owned_by": "symphony-agent"}
              for name, at in sorted(agents.items()))]})

    async def unknown(request: Request) -> Response:
        raise OpenAIError(f"Unknown request URL: {request.method} {request.url.path}",
                          status=404, code="unknown_url")

    return [
        Route("/v1/chat/completions", _guarded(chat), methods=["POST"]),
        Route("/v1/completions", _guarded(completions), methods=["POST"]),
        Route("/v1/models", _guarded(models), methods=["GET"]),
        Route("/v1/{path:path}", _guarded(unknown),
              methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
    ]
