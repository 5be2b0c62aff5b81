"""The load half of `symphony bench tasks`: many concurrent asks against one daemon's HTTP API.

``LOAD_CONCURRENT`` clients ask the asker daemon at once (``POST /tasks/``, a short arithmetic
question, k = 1, ``LOAD_MAX_TOKENS`` tokens), in waves, until ``asks`` asks have been made.
Every ask must end one of two ways: done (an answer), or a clear failure, meaning a ``failed``
task whose ``failure`` names the reason or an HTTP 4xx whose body names the error. Anything
else (a timeout, a 5xx without a reason, a dropped connection) counts as unclear (goal 0).
Meanwhile ``GET /status`` is asked every 0.1 s. Open file
descriptors are read before the first ask and again once the load client has closed its
connections (the daemon closes its ends within its keep-alive timeout), resident memory after
the first (warm-up) wave and after the last, so the growth figures show what 1,000 asks (full
run) leave behind.

Keys: ``load_concurrent``, ``load_asks``, ``load_done``, ``load_failed_clear``,
``load_unclear``, ``load_ask_p50_ms``, ``load_ask_p99_ms``, ``load_status_p99_ms``,
``load_fd_growth``, ``load_rss_growth_mib``, ``load_top_failure`` (the most frequent reason
a clear failure gave) and ``load_first_unclear`` (the first unclear outcome); "" when none.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from node.bench.probes import StatusPoller, fd_count, pct, rss_mib

LOAD_CONCURRENT = 50
QUICK_LOAD_ASKS, FULL_LOAD_ASKS = 100, 1_000
LOAD_MAX_TOKENS = 4
LOAD_DEADLINE_MS = 60_000
#: the client waits this long beyond the task's deadline before calling an ask unclear
CLIENT_GRACE_S = 30.0
#: after the load, how long the daemon may take to close the client's idle connections
FD_SETTLE_S = 15.0


def _outcome(response: httpx.Response) -> str:
    """"done", "failed_clear: <the reason given>" or "unclear: ..." for one ask's response."""
    try:
        body: Any = response.json()
    except ValueError:
        return f"unclear: HTTP {response.status_code}, not JSON"
    if response.status_code == 200 and isinstance(body, dict):
        if body.get("phase") == "done":
            return "done"
        if body.get("phase") == "failed" and body.get("failure"):
            return f"failed_clear: {body['failure']}"
        return f"unclear: phase {body.get('phase')!r}, failure {body.get('failure')!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if 400 <= response.status_code < 500 and isinstance(error, dict) and error.get("message"):
        return f"failed_clear: HTTP {response.status_code}: {error['message']}"
    return f"unclear: HTTP {response.status_code}: {str(body)[:200]}"


class _Asker:
    def __init__(self, api_url: str, token: str) -> None:
        self.client = httpx.Client(
            base_url=api_url, headers={"Authorization": f"Bearer {token}"},
            timeout=LOAD_DEADLINE_MS / 1000 + CLIENT_GRACE_S,
            limits=httpx.Limits(max_connections=LOAD_CONCURRENT + 4))
        self.outcomes: list[str] = []
        self.ask_ms: list[float] = []

    def ask(self, i: int) -> None:
        t0 = time.perf_counter()
        try:
            response = self.client.post("/tasks/", json={
                "question": f"What is {i % 89 + 2} plus {i % 7 + 3}?", "answer_type": "number",
                "k": 1, "max_tokens": LOAD_MAX_TOKENS, "deadline_ms": LOAD_DEADLINE_MS})
            outcome = _outcome(response)
        except httpx.HTTPError as exc:
            outcome = f"unclear: {type(exc).__name__}: {exc}"
        self.ask_ms.append((time.perf_counter() - t0) * 1000)
        self.outcomes.append(outcome)

    def wave(self, pool: ThreadPoolExecutor, start: int, n: int) -> None:
        list(pool.map(self.ask, range(start, start + n)))


def _settled_fds(pid: int, baseline: int) -> int:
    """The daemon's open fds once the closed client's connections are gone on its side too
    (it closes an idle keep-alive connection within its keep-alive timeout): read until the
    count is back to ``baseline`` or FD_SETTLE_S passes, then the last count."""
    deadline = time.monotonic() + FD_SETTLE_S
    count = fd_count(pid)
    while count > baseline and time.monotonic() < deadline:
        time.sleep(0.2)
        count = fd_count(pid)
    return count


def run_load(node: Any, token: str, asks: int) -> dict[str, Any]:
    """Ask ``node`` (a node.testnet.NodeProcess) ``asks`` times, LOAD_CONCURRENT at once."""
    pid = node.proc.pid
    fd0 = fd_count(pid)  # before any load client connected
    asker = _Asker(node.api_url, token)
    with StatusPoller(node.api_url) as poller, \
            ThreadPoolExecutor(max_workers=LOAD_CONCURRENT) as pool:
        asker.wave(pool, 0, LOAD_CONCURRENT)
        rss0 = rss_mib(pid)
        made = LOAD_CONCURRENT
        while made < asks:
            n = min(LOAD_CONCURRENT, asks - made)
            asker.wave(pool, made, n)
            made += n
        rss1 = rss_mib(pid)
    asker.client.close()
    fd1 = _settled_fds(pid, fd0)
    unclear = [o for o in asker.outcomes if o.startswith("unclear")]
    failures = Counter(o.split(": ", 1)[1] for o in asker.outcomes if o.startswith("failed_clear"))
    return {
        "load_concurrent": LOAD_CONCURRENT,
        "load_asks": len(asker.outcomes),
        "load_done": asker.outcomes.count("done"),
        "load_failed_clear": sum(failures.values()),
        "load_top_failure": failures.most_common(1)[0][0] if failures else "",
        "load_unclear": len(unclear),
        "load_first_unclear": unclear[0] if unclear else "",
        "load_ask_p50_ms": round(pct(asker.ask_ms, 0.5), 1),
        "load_ask_p99_ms": round(pct(asker.ask_ms, 0.99), 1),
        "load_status_p99_ms": poller.p99_ms(),
        "load_fd_growth": fd1 - fd0,
        "load_rss_growth_mib": round(rss1 - rss0, 1),
    }
