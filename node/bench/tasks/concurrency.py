"""Many users at once: `symphony bench tasks --concurrency 1,4,16`, the network beside
llama.cpp's own ``llama-server``.

Its own local network (real daemons on loopback): an asker that serves no model and one
executor with ``slots`` equal to the highest level, the embedded SmolLM2 on llama.cpp with
``threads`` threads, which decodes its concurrent tasks together in one batch
(models/batched.py). At each level N, N clients ask at once (k = 1 ``POST /tasks/``, greedy,
the same arithmetic questions and ``max_tokens`` as the rest of `bench tasks`), in
``waves`` waves. The same prompts, as the very token ids the executor builds
(models.cot.build_prompt through the model's chat template), go to ``llama-server``
(node/bench/tasks/llama_server.py: the llama.cpp that llama-cpp-python vendors) started with
``--parallel N``, the same model file and the same thread count, N requests at once per wave.
The two are measured level by level, one right after the other, so the shared machine's
load hits both alike. Both warm up with the same question, :data:`WARM_UP`, none of the
measured ones: llama-server keeps a slot's last prompt and reuses what a new one shares
with it (the chat template's opening, as it would for any user), but never serves a
measured prompt whole from that cache.

Keys per level N: ``throughput_rps_<N>`` (answers per second of a wave: N over the wave's
wall time, mean over the waves), ``p50_ms_<N>`` and ``p99_ms_<N>`` (each ask's time as its
HTTP client sees it), ``done_<N>`` (asks answered), the same for llama-server with the prefix
``llama_server_``, ``throughput_ratio_vs_llama_server_<N>`` (the network's throughput
over llama-server's) and ``first_failure_<N>`` (why the first failed ask failed; "" when none).
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from node.bench.probes import pct
from node.bench.tasks.settle import wait_settled

#: the warm-up ask of both, not one of the measured questions
WARM_UP = "What is 2 plus 2?"
#: the network's asks of one wave time out after this (a 16-user wave on loaded cores)
ASK_DEADLINE_MS = 120_000
#: per-sequence context of both: the batched decoder's (models.batched.DEFAULT_SEQ_CTX)
SLOT_CTX = 1_024
QUICK_WAVES, FULL_WAVES = 1, 3
#: how long the asks' client keeps an idle connection: under the daemon's HTTP server's own
#: keep-alive (hypercorn's 5 s), so a wave after a long llama-server level never reuses a
#: connection the server is closing at that moment (the ask failed "connection reset")
KEEPALIVE_S = 2.0
START_TIMEOUT_S = 120.0
#: time the executor gets per attempt before the asker replaces it (beyond its estimate):
#: generous, so a loaded machine shows as latency, not as failed asks (there is no other
#: executor to replace it with)
ASSIGN_BASE_MS = 60_000


def parse_levels(spec: str) -> tuple[int, ...]:
    """``"1,4,16"`` -> (1, 4, 16); ValueError for anything but positive integers (at most
    64) separated by commas."""
    try:
        levels = tuple(int(part) for part in spec.split(","))
    except ValueError:
        raise ValueError(f"concurrency levels must be integers like 1,4,16, not {spec!r}") from None
    if not levels or any(not 1 <= n <= 64 for n in levels):
        raise ValueError(f"concurrency levels must be between 1 and 64, got {spec!r}")
    return levels


def _wave(call: Any, jobs: list[Any]) -> tuple[float, list[float], int]:
    """Run ``call`` on every job at once: (wall seconds, each call's ms, calls that
    succeeded)."""
    def timed(job: Any) -> tuple[float, bool]:
        t0 = time.perf_counter()
        ok = call(job)
        return (time.perf_counter() - t0) * 1000, ok

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(timed, jobs))
    return time.perf_counter() - t0, [ms for ms, _ in results], sum(ok for _, ok in results)


def _figures(prefix: str, n: int, waves: list[tuple[float, list[float], int]]) -> dict[str, Any]:
    latencies = [ms for _, mss, _ in waves for ms in mss]
    return {
        f"{prefix}throughput_rps_{n}": round(sum(d / w for w, _, d in waves) / len(waves), 3),
        f"{prefix}p50_ms_{n}": round(pct(latencies, 0.5), 1),
        f"{prefix}p99_ms_{n}": round(pct(latencies, 0.99), 1),
        f"{prefix}done_{n}": sum(d for _, _, d in waves),
    }


class _NetworkAsks:
    """k = 1 asks on the asker's HTTP API."""

    def __init__(self, api_url: str, token: str, max_tokens: int, clients: int) -> None:
        self.max_tokens = max_tokens
        #: why each failed ask failed, in order (the first goes into the figures)
        self.failures: list[str] = []
        self.client = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"},
                                   timeout=ASK_DEADLINE_MS / 1000 + 15,
                                   limits=httpx.Limits(max_connections=clients + 2,
                                                       keepalive_expiry=KEEPALIVE_S))

    def __call__(self, question: str) -> bool:
        try:
            snap = self.client.post("/tasks/", json={
                "question": question, "answer_type": "number", "k": 1,
                "max_tokens": self.max_tokens, "deadline_ms": ASK_DEADLINE_MS}).json()
        except (httpx.HTTPError, ValueError) as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
            return False
        if isinstance(snap, dict) and snap.get("phase") == "done":
            return True
        self.failures.append(str(snap.get("failure") if isinstance(snap, dict) else snap)[:160])
        return False


class _ServerAsks:
    """The same prompts (token ids) as completions on llama-server, greedy."""

    def __init__(self, url: str, max_tokens: int, clients: int) -> None:
        self.max_tokens = max_tokens
        self.client = httpx.Client(base_url=url, timeout=ASK_DEADLINE_MS / 1000,
                                   limits=httpx.Limits(max_connections=clients + 2))

    def __call__(self, prompt_ids: list[int]) -> bool:
        try:
            response = self.client.post("/completion", json={
                "prompt": prompt_ids, "n_predict": self.max_tokens, "temperature": 0.0})
        except httpx.HTTPError:
            return False
        return response.status_code == 200


def _start_network(net: Any, slots: int, threads: int) -> Any:
    """The asker (no model) and one executor with ``slots`` slots; the asker's handle."""
    asker = net.start("asker", config={"executor": {"solver": ""},
                                       "tasks": {"assign_base_ms": ASSIGN_BASE_MS}},
                      timeout_s=START_TIMEOUT_S)
    executor = net.start("e0", bootstrap=[asker], config={"executor": {
        "solver": "models", "threads": threads, "slots": slots}}, timeout_s=START_TIMEOUT_S)
    net.wait_all_connected(START_TIMEOUT_S)
    wait_settled(net, [executor], START_TIMEOUT_S)  # its start-up work, not the asks, first
    return asker


def run_concurrency(backend: Any, levels: tuple[int, ...], questions: list[str],
                    max_tokens: int, threads: int, quick: bool, link: str = "") -> dict[str, Any]:
    """The per-level figures; ``backend`` is the model loaded in this process (its file is
    llama-server's, its chat template builds the prompts); ``questions``: at least
    ``max(levels)``."""
    from models.cot import Problem, build_prompt
    from node.api.token import read_token
    from node.bench.tasks.llama_server import LlamaServer, ensure_built
    from node.testnet import FAST_MEMBERSHIP, LocalTestnet
    from protocol.answers import AnswerType

    ensure_built()  # not timed: the first run builds it (minutes)
    waves = QUICK_WAVES if quick else FULL_WAVES
    top = max(levels)
    prompts = [backend.prompt_ids(build_prompt(Problem(q, AnswerType.NUMBER), True))
               for q in [WARM_UP, *questions[:top]]]
    warm, prompts = prompts[0], prompts[1:]
    figures: dict[str, Any] = {"concurrency_levels": ",".join(map(str, levels)),
                               "concurrency_waves": waves, "concurrency_threads": threads}
    with tempfile.TemporaryDirectory(prefix="symphony-bench-concurrency-") as tmp:
        net = LocalTestnet(Path(tmp), network_id="bench-concurrency", config=FAST_MEMBERSHIP,
                           link=link)
        try:
            asker = _start_network(net, top, threads)
            asks = _NetworkAsks(asker.api_url, read_token(asker.data_dir), max_tokens, top)
            asks(WARM_UP)  # warm-up: the beacon topic's mesh forms
            for n in levels:
                with LlamaServer(Path(backend.info.path), parallel=n, threads=threads,
                                 slot_ctx=SLOT_CTX) as server:
                    served = _ServerAsks(server.url, max_tokens, n)
                    # warm-up: its first decode sets up buffers; the network's own warm-up
                    # question, not a measured one, whose whole prompt it would then
                    # serve from its prompt cache
                    served(warm)
                    theirs = [_wave(served, prompts[:n]) for _ in range(waves)]
                asks.failures.clear()
                ours = [_wave(asks, questions[:n]) for _ in range(waves)]
                figures[f"first_failure_{n}"] = asks.failures[0] if asks.failures else ""
                figures.update(_figures("", n, ours))
                figures.update(_figures("llama_server_", n, theirs))
                figures[f"throughput_ratio_vs_llama_server_{n}"] = round(
                    figures[f"throughput_rps_{n}"]
                    / max(figures[f"llama_server_throughput_rps_{n}"], 1e-9), 3)
        finally:
            net.kill_all()
    return figures
