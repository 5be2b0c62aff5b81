"""The daemon's local HTTP API: Starlette on hypercorn's trio worker, bound to 127.0.0.1 only.

* ``GET /status``: the node's status (see ``Daemon.status``), open to local readers.
* Each service's ``routes()`` are mounted under ``/<service name>``.
* Mutating endpoints need ``Authorization: Bearer <token>``; the token is a random secret in
  ``<data_dir>/api.token`` (mode 0600, created on first run; node/api/token.py), which the CLI
  client reads (node/control.py). Declare such a route with :func:`token_route`, or wrap an
  endpoint with :func:`require_token`::

      def routes(self) -> list[BaseRoute]:
          return [Route("/records", self.list_records),                 # GET, open
                  token_route("/publish", self.publish, methods=["POST"])]  # needs the token

The server listens on the configured port (0 picks a free one); ``serve_api`` reports the
bound port through ``task_status.started(port)``.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

API_HOST = "127.0.0.1"
#: an idle kept-alive connection is closed after this long (node/control.py's client drops
#: its own sooner)
KEEP_ALIVE_S = 5.0
#: hypercorn waits this long for open requests when the daemon stops
GRACEFUL_TIMEOUT_S = 1.0

Endpoint = Callable[[Request], Awaitable[Response]]


def require_token(endpoint: Endpoint) -> Endpoint:
    """Wrap an endpoint so it answers 401 unless the request carries the API bearer token."""

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        expected: str = request.app.state.api_token
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(),
                                                                  expected.encode()):
            return JSONResponse({"error": "missing or wrong API token"}, status_code=401)
        return await endpoint(request)

    return guarded


def token_route(path: str, endpoint: Endpoint, *, methods: Sequence[str] = ("POST",)) -> Route:
    """A route whose endpoint needs the API token (for anything that changes state)."""
    return Route(path, require_token(endpoint), methods=list(methods))


async def json_object(request: Request) -> dict[str, Any] | None:
    """The request body as a JSON object; None when it is not JSON or not an object."""
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def build_app(
    status: Callable[[], dict[str, Any]],
    service_routes: dict[str, list[BaseRoute]],
    token: str,
    root_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    async def get_status(request: Request) -> Response:
        return JSONResponse(status())

    routes: list[BaseRoute] = [Route("/status", get_status, methods=["GET"]), *root_routes]
    for name, sub in service_routes.items():
        if sub:
            routes.append(Mount(f"/{name}", routes=sub))
    app = Starlette(routes=routes)
    app.state.api_token = token
    return app


async def serve_api(
    app: Starlette, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``app`` on 127.0.0.1:``port`` until cancelled; ``started(bound_port)``."""
    config = HypercornConfig()
    config.bind = [f"{API_HOST}:{port}"]
    config.graceful_timeout = GRACEFUL_TIMEOUT_S
    config.keep_alive_timeout = KEEP_ALIVE_S
    config.accesslog = None
    config.errorlog = None

    class _Status:
        def started(self, binds: list[str]) -> None:
            task_status.started(int(binds[0].rsplit(":", 1)[1]))

    await serve(app, config, task_status=_Status())  # type: ignore[arg-type]
