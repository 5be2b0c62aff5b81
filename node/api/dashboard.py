"""The web dashboard: ``http://127.0.0.1:<api port>/``, one static page kept live by SSE.

Signing in
----------
The dashboard is guarded by the same API token as the mutating endpoints, but a browser
cannot send a bearer header by itself. So the URL that ``symphony node dashboard`` (and
``make demo``) prints carries the token once: ``GET /?token=<token>`` checks it, sets an
HttpOnly, SameSite=Strict session cookie and redirects to ``/``, so the token leaves the
address bar and the history. The cookie holds ``HMAC(token, "symphony-dashboard-session")``,
not the token itself, and its name carries a tag of that value, so the dashboards of several
daemons on one machine (cookies ignore ports) keep their own sessions. Without a valid cookie
the page answers 401 with how to get the URL.

Routes (mounted at the API's root)
----------------------------------
* ``GET /``: the page (``static/dashboard.html``); ``GET /dashboard/static/<file>``: its
  scripts (JavaScript modules, no build step), style sheet and icon (public, no session
  needed);
* ``GET /dashboard/state``: the state document (node/api/dashboard_state.py) as JSON;
* ``GET /dashboard/events``: the same document as server-sent events, one ``data:`` line
  every ``PUSH_INTERVAL_S``; at most ``MAX_STREAMS`` open at once (503 beyond);
* ``GET /dashboard/live/<task id>``: what the daemon saw of one task beyond its stored
  snapshot, ``{"bids": [...], "verification": [...]}``; open to local readers like
  ``GET /tasks/<id>`` (``symphony ask`` polls it for its live view, node/cli/progress.py);
* ``POST /dashboard/ask``: ``{"question": str, "k": int}``: asks the network through the
  tasks service's own ask path (what ``POST /tasks/`` and ``/v1/chat/completions`` use) and
  answers ``{"task_id", "phase", "answer", "failure"}``. It needs the session cookie, the
  ``X-Symphony-Dashboard: 1`` header (a cross-origin page cannot send it without a CORS
  preflight, which is never granted) and, when the browser sends one, our own ``Origin``.

Every route refuses a ``Host`` other than 127.0.0.1 or localhost (DNS rebinding). The page
loads nothing from elsewhere; its Content-Security-Policy says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import BaseRoute, Route

from node.api.app import json_object
from node.api.dashboard_state import DashboardSource, LiveFeed, dashboard_state
from node.market.api import AskError, best_answer_text

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"dashboard.js": "text/javascript", "dom.js": "text/javascript",
                "charts.js": "text/javascript", "activity.js": "text/javascript",
                "jobs.js": "text/javascript", "plans.js": "text/javascript",
                "dashboard.css": "text/css",
                "icon.svg": "image/svg+xml"}
COOKIE_PREFIX = "symphony_dashboard_"
SESSION_CONTEXT = b"symphony-dashboard-session"
#: seconds between two pushes of the state on the event stream
PUSH_INTERVAL_S = 1.0
#: event streams open at once (each rebuilds the state every PUSH_INTERVAL_S)
MAX_STREAMS = 8
#: the chat box asks with at most this many executors
MAX_K = 7
MAX_QUESTION_CHARS = 4000
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
SIGN_IN_HELP = """<!doctype html><meta charset="utf-8"><title>symphony: sign in</title>
<p>This dashboard needs the node's API token. Open the URL that
<code>symphony node dashboard --data-dir DIR</code> prints (it carries the token once and
then keeps a session cookie).</p>"""


def session_value(token: str) -> str:
    return hmac.new(token.encode(), SESSION_CONTEXT, hashlib.sha256).hexdigest()


def cookie_name(token: str) -> str:
    return COOKIE_PREFIX + hashlib.sha256(session_value(token).encode()).hexdigest()[:12]


def dashboard_url(api_url: str, token: str) -> str:
    """The sign-in URL of a daemon's dashboard (what the CLI prints)."""
    return f"{api_url}/?token={token}"


class Dashboard:
    def __init__(self, source: DashboardSource, feed: LiveFeed) -> None:
        self.source = source
        self.feed = feed
        self.streams = 0

    def state(self) -> dict[str, Any]:
        return dashboard_state(self.source, self.feed)

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.page, methods=["GET"]),
            Route("/dashboard/static/{name:str}", self.static, methods=["GET"]),
            Route("/dashboard/state", self.guarded(self.get_state), methods=["GET"]),
            Route("/dashboard/events", self.guarded(self.events), methods=["GET"]),
            Route("/dashboard/ask", self.guarded(self.ask), methods=["POST"]),
            Route("/dashboard/live/{task_id:str}", self.task_live, methods=["GET"]),
        ]

    # ---- sign-in and guards ---------------------------------------------------------------

    @staticmethod
    def _signed_in(request: Request) -> bool:
        token: str = request.app.state.api_token
        given = request.cookies.get(cookie_name(token), "")
        return hmac.compare_digest(given.encode(), session_value(token).encode())

    def guarded(self, endpoint: Any) -> Any:
        async def guard(request: Request) -> Response:
            if not _loopback_host(request):
                return _plain_error("wrong Host header", 421)
            if not self._signed_in(request):
                return _plain_error("sign in first: open the URL `symphony node dashboard` "
                                    "prints", 401)
            response: Response = await endpoint(request)
            return response

        return guard

    async def page(self, request: Request) -> Response:
        if not _loopback_host(request):
            return _plain_error("wrong Host header", 421)
        token: str = request.app.state.api_token
        given = request.query_params.get("token")
        if given is not None:
            if not hmac.compare_digest(given.encode(), token.encode()):
                return HTMLResponse(SIGN_IN_HELP, status_code=401, headers=SECURITY_HEADERS)
            response = RedirectResponse("/", status_code=303, headers=SECURITY_HEADERS)
            response.set_cookie(cookie_name(token), session_value(token), httponly=True,
                                samesite="strict", path="/")
            return response
        if not self._signed_in(request):
            return HTMLResponse(SIGN_IN_HELP, status_code=401, headers=SECURITY_HEADERS)
        return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html",
                            headers=SECURITY_HEADERS)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_FILES:
            return _plain_error("no such file", 404)
        return FileResponse(STATIC_DIR / name, media_type=STATIC_FILES[name],
                            headers=SECURITY_HEADERS)

    # ---- data -----------------------------------------------------------------------------

    async def get_state(self, request: Request) -> Response:
        return JSONResponse(self.state(), headers=SECURITY_HEADERS)

    async def task_live(self, request: Request) -> Response:
        if not _loopback_host(request):
            return _plain_error("wrong Host header", 421)
        task_id = request.path_params["task_id"].lower()
        return JSONResponse({"task_id": task_id, "bids": self.feed.bids.get(task_id, []),
                             "verification": self.feed.checks.get(task_id, [])})

    async def events(self, request: Request) -> Response:
        if self.streams >= MAX_STREAMS:
            return _plain_error(f"too many open dashboards (at most {MAX_STREAMS})", 503)
        return StreamingResponse(self._stream(), media_type="text/event-stream",
                                 headers={**SECURITY_HEADERS, "X-Accel-Buffering": "no"})

    async def _stream(self) -> AsyncIterator[str]:
        self.streams += 1
        try:
            while True:
                yield f"data: {json.dumps(self.state(), separators=(',', ':'))}\n\n"
                await trio.sleep(PUSH_INTERVAL_S)
        finally:
            self.streams -= 1

    async def ask(self, request: Request) -> Response:
        if request.headers.get("x-symphony-dashboard") != "1":
            return _plain_error("missing X-Symphony-Dashboard header", 403)
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            return _plain_error(f"cross-origin ask refused ({origin})", 403)
        tasks = self.source.services.get("tasks")
        if tasks is None:
            return _plain_error("this node has no tasks service", 503)
        question, k = _ask_fields(await json_object(request))
        if isinstance(question, Response):
            return question
        try:
            snap = await tasks.ask({"question": question, "k": k, "answer_type": "text"})
        except AskError as exc:
            return _plain_error(str(exc), 400)
        return JSONResponse({"task_id": snap["task_id"], "phase": snap["phase"],
                             "answer": best_answer_text(snap) if snap["phase"] == "done" else None,
                             "failure": snap.get("failure")})


def _ask_fields(body: object) -> tuple[str | Response, int]:
    if not isinstance(body, dict):
        return _plain_error("the body must be a JSON object", 400), 0
    question, k = body.get("question"), body.get("k", 1)
    if not isinstance(question, str) or not question.strip():
        return _plain_error("question must be a non-empty string", 400), 0
    if len(question) > MAX_QUESTION_CHARS:
        return _plain_error(f"question is over {MAX_QUESTION_CHARS} characters", 400), 0
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        return _plain_error(f"k must be an integer from 1 to {MAX_K}", 400), 0
    return question.strip(), k


def _loopback_host(request: Request) -> bool:
    host = request.headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name in LOOPBACK_HOSTS


def _plain_error(message: str, status: int) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=SECURITY_HEADERS)
