"""HTTP routes of distributed inference, mounted under ``/inference``.

* ``GET /inference/``: what this node serves (model, block range, sessions, ms per block).
* ``POST /inference/generate`` (API token): JSON ``prompt`` (string), ``max_tokens`` (1..4096,
  default 64), ``speculative`` (the longest draft a step makes, 0..16, default 0 = plain greedy;
  each step's length adapts to the measured acceptance and step times),
  ``rule`` ("greedy", the default: the output is plain greedy decoding's; or "mars": margin-aware
  acceptance of the target's close second choices, faster, not exact).
  Answers the generated ``text`` and ``tokens``, ``tokens_per_s``, ``acceptance_rate``,
  the ``chain`` used (peer and block range per hop), ``recoveries``; 400 with a message that
  names the problem (bad input, no chain covering the model).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from node.api.app import token_route


def _error(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def inference_routes(service: Any) -> list[BaseRoute]:
    async def show(request: Request) -> Response:
        return JSONResponse(service.status())

    async def generate(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
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
        try:
            result = await service.generate(prompt, max_tokens, speculative, rule)
        except ValueError as exc:
            return _error(str(exc))
        return JSONResponse(result)

    return [Route("/", show, methods=["GET"]), token_route("/generate", generate)]
