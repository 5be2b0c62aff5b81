"""HTTP routes of distributed inference, mounted under ``/inference``.

* ``GET /inference/``: what this node serves (model, block range, sessions, ms per block).
* ``POST /inference/generate`` (API token): JSON ``prompt`` (string), ``max_tokens`` (1..4096,
  default 64), ``speculative`` (the longest draft a step makes, 0..16, default 0 = plain greedy;
  each step's length adapts to the measured acceptance and step times),
  ``rule`` ("greedy", the default: the output is plain greedy decoding's; or "mars": margin-aware
  acceptance of the target's close second choices, faster, not exact), and sampling:
  ``temperature`` (0..2, default 0 = greedy; above 0 drafts are verified by speculative
  rejection sampling, so the output is distributed as plain sampling's), ``top_p`` (nucleus
  mass, default 1), ``seed`` (default 0), ``stop`` (a string or a list of them).
  ``wait_s`` (0..3600, default ``DEFAULT_WAIT_S``): how long to wait while some of the model's
  blocks are offered by no one yet (a server loading, an offer not yet in the ledger).
  Answers the generated ``text`` and ``tokens``, ``tokens_per_s``, ``acceptance_rate``,
  the ``chain`` used (peer and block range per hop), ``recoveries``; 400 with a message that
  names the problem (bad input, the blocks no one serves when the wait ended, no chain).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.api.app import json_object, token_route

#: how long a generation waits for missing blocks unless the request says
DEFAULT_WAIT_S = 60.0
#: the longest wait a request may ask for
MAX_WAIT_S = 3600.0


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _sampling(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The sampling fields given (temperature, top_p, seed, stop), or what is wrong with one."""
    out: dict[str, Any] = {}
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            if type(body[key]) not in (int, float):
                return {}, f"{key!r} must be a number, got {body[key]!r}"
            out[key] = float(body[key])
    if body.get("seed") is not None:
        if type(body["seed"]) is not int or body["seed"] < 0:
            return {}, f"'seed' must be a non-negative integer, got {body['seed']!r}"
        out["seed"] = body["seed"]
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops):
            return {}, "'stop' must be a non-empty string or a list of them"
        out["stop"] = tuple(stops)
    return out, ""


def inference_routes(service: Any) -> list[BaseRoute]:
    async def show(request: Request) -> Response:
        return JSONResponse(service.status())

    async def generate(request: Request) -> Response:
        body = await json_object(request)
        if body is None:
            return _error("the body must be a JSON object")
        prompt, max_tokens = body.get("prompt"), body.get("max_tokens", 64)
        speculative = body.get("speculative", 0)
        rule = body.get("rule", "greedy")
        if rule not in ("greedy", "mars"):
            return _error(f"'rule' must be 'greedy' or 'mars', got {rule!r}")
        if not isinstance(prompt, str) or not prompt:
            return _error("'prompt' must be a non-empty string")
        for key, value in (("max_tokens", max_tokens), ("speculative", speculative)):
            if type(value) is not int:
                return _error(f"{key!r} must be an integer, got {value!r}")
        wait_s = body.get("wait_s", DEFAULT_WAIT_S)
        if type(wait_s) not in (int, float) or not 0 <= wait_s <= MAX_WAIT_S:
            return _error(f"'wait_s' must be a number of seconds in [0, {MAX_WAIT_S:g}], "
                          f"got {wait_s!r}")
        sampling, problem = _sampling(body)
        if problem:
            return _error(problem)
        try:
            result = await service.generate(prompt, max_tokens, speculative, rule,
                                            wait_s=float(wait_s), **sampling)
        except ValueError as exc:
            return _error(str(exc))
        return JSONResponse(result)

    return [Route("/", show, methods=["GET"]), token_route("/generate", generate)]
