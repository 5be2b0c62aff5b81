"""The k = 1 streaming figures of `symphony bench tasks`: time to the first token and to the
whole answer, as an OpenAI client sees them.

Each question is asked as a k = 1 chat with ``stream: true`` on the asker's
``/v1/chat/completions`` (server-sent events, node/api/openai_routes.py); the executor streams
its tokens across the network as it generates them (protocol/market/progress.py).
``ttft_ms_k1`` is the p50 time from sending the request to the first content chunk,
``total_ms_k1`` to the end of the stream, ``stream_chunks_k1`` the p50 count of content chunks.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import httpx

from node.control import tls_verify


class StreamFailed(Exception):
    """The stream ended in an error event, or without ``[DONE]``."""


def stream_chat(api_url: str, token: str, model: str, question: str, max_tokens: int,
                timeout_s: float) -> tuple[float, float, int]:
    """(ms to the first content chunk, ms to the end, content chunks) of one streamed k = 1
    chat; raises StreamFailed or httpx's errors."""
    body = {"model": model, "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": question}]}
    t0 = time.perf_counter()
    first: float | None = None
    chunks = 0
    with httpx.stream("POST", f"{api_url}/v1/chat/completions", json=body, timeout=timeout_s,
                      verify=tls_verify(api_url),
                      headers={"Authorization": f"Bearer {token}"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                total = (time.perf_counter() - t0) * 1000
                if first is None:
                    raise StreamFailed("the stream carried no content")
                return first, total, chunks
            event = json.loads(data)
            if "error" in event:
                raise StreamFailed(str(event["error"].get("message")))
            choices = event.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                chunks += 1
                if first is None:
                    first = (time.perf_counter() - t0) * 1000
    raise StreamFailed("the stream ended without [DONE]")


def stream_figures(api_url: str, token: str, model: str, questions: list[str],
                   max_tokens: int, timeout_s: float) -> dict[str, Any]:
    """The ``ttft_ms_k1``, ``total_ms_k1`` and ``stream_chunks_k1`` figures (p50 over the
    questions; ``stream_failed_k1`` counts the asks that failed)."""
    firsts, totals, counts = [], [], []
    failed = 0
    for question in questions:
        try:
            first, total, chunks = stream_chat(api_url, token, model, question, max_tokens,
                                               timeout_s)
        except (StreamFailed, httpx.HTTPError):
            failed += 1
            continue
        firsts.append(first)
        totals.append(total)
        counts.append(chunks)

    def p50(values: list[float]) -> float:
        return round(statistics.median(values), 1) if values else float("nan")

    return {"ttft_ms_k1": p50(firsts), "total_ms_k1": p50(totals),
            "stream_chunks_k1": p50([float(c) for c in counts]), "stream_failed_k1": failed}
