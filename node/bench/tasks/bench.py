"""`symphony bench tasks`: time from ask to answer on a local network of real daemons.

Four daemons on loopback (separate processes): one asks (it serves no model), three execute
with the default solver, the embedded SmolLM2 on llama.cpp (``[executor] solver = "models"``,
greedy, ``THREADS`` thread each since they share this machine). The questions are the
arithmetic items of the shipped evaluation set (models/data/evalset.jsonl), with a small
``max_tokens`` so the run stays short.

For k = 1 and k = 3 it reports p50/p99 of the total as seen by the HTTP client and of each
phase from the task snapshot: auction (beacon + bids, to the first assignment), execution
(first assignment to the last result, which includes the executors' model time) and voting
(last result to the final vote). ``overhead_ratio_k1`` is the k = 1 ask time over the time
of calling the model directly in this process (``models.cot.solve`` on the same backend and
model, same question, same ``max_tokens``, same greedy sampling, same thread count), measured
in the same run and interleaved with the k = 1 asks so the shared machine's load hits both
alike. ``k1_compute_p50_ms`` is the executor's own time for a task (it also commits to the
layer states verification binds: taken from the generation itself, models.llama_capture, then
hashed and written to its state store, models.commitments; no second pass over the tokens but
the last token of an output cut at its length); ``k1_same_answer`` is the share of k = 1
answers equal to the direct call's (greedy on the same backend: expect 1). Both backends keep
the same prompt cache (models.prompt_cache), as llama-server does.

``ttft_ms_k1`` and ``total_ms_k1`` (node/bench/tasks/stream.py): the same questions as k = 1
chats streamed through the OpenAI endpoint, p50 time to the first content chunk (the executor
streams its tokens across the network) and to the end of the stream.

Then the load (node/bench/tasks/load.py): 50 concurrent asks at a time against the asker's
HTTP API, 1,000 in all (``--quick``: 100), each done or failed with a clear error
(``load_unclear`` counts the others, goal 0), ``/status`` latency meanwhile, and the asker's
fd and memory growth over them (``load_*`` keys).

``--concurrency 1,4,16`` (node/bench/tasks/concurrency.py) replaces the load with many users
at once on a network of one batching executor, beside llama.cpp's ``llama-server``
(``throughput_rps_<N>``, ``p50_ms_<N>``, ``p99_ms_<N>``, ``throughput_ratio_vs_llama_server_<N>``).

``--link SPEC`` runs every daemon behind that link (node/p2p/link.py; ``link`` echoes it): the
asker's beacons, bids, assignments and results all cross it, while the direct call, the
baseline, stays in this process.

``overhead_ratio_k3`` is, per k = 3 ask, its time over the compute time of the slowest of its
executors (the least any k = 3 ask could take), p50 over the asks.

The daemons run with their default task settings: the auction closes when k + 1 bids are in
(one spare), when every executor the ledger knows has bid, ``close_grace_ms`` after the k-th
bid, or when its bid window passes (protocol/market/bidding.py); the k3 auction figures show
which.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: llama.cpp threads per executor daemon and for the direct call (three executors share cores)
THREADS = 1
QUICK_ASKS, FULL_ASKS = 3, 10
QUICK_MAX_TOKENS, FULL_MAX_TOKENS = 32, 96
ASK_DEADLINE_MS = 90_000
#: time an executor gets per attempt before being replaced (beyond its estimate): generous,
#: so a shared machine's load shows as latency, not as replans; it never adds to latency
ASSIGN_BASE_MS = 60_000
#: start-up of four daemons that load and measure a model, at once on shared cores
START_TIMEOUT_S = 120.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _questions(n: int) -> list[str]:
    from models.evalset import load_evalset
    from protocol.answers import AnswerType

    items = [it for it in load_evalset() if it.problem.answer_type is AnswerType.NUMBER]
    return [it.problem.question for it in items[:n]]


def _ask(client: Any, question: str, k: int, max_tokens: int) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    snap: dict[str, Any] = client.post("/tasks/", {
        "question": question, "answer_type": "number", "k": k, "max_tokens": max_tokens,
        "deadline_ms": ASK_DEADLINE_MS})
    return (time.perf_counter() - t0) * 1000, snap


def run(quick: bool, link: str = "", concurrency: str = "") -> dict[str, Any]:
    from models.config import ModelConfig
    from models.loader import load_backend
    from node.api.token import read_token
    from node.bench.tasks.concurrency import parse_levels, run_concurrency
    from node.bench.tasks.load import FULL_LOAD_ASKS, QUICK_LOAD_ASKS, run_load
    from node.bench.tasks.stream import stream_figures
    from node.control import ApiClient
    from node.market.requester import TasksSection
    from node.testnet import FAST_MEMBERSHIP, LocalTestnet

    levels = parse_levels(concurrency) if concurrency else ()
    asks = QUICK_ASKS if quick else FULL_ASKS
    max_tokens = QUICK_MAX_TOKENS if quick else FULL_MAX_TOKENS
    questions = _questions(asks)
    figures: dict[str, Any] = {"link": link, "asks_per_k": asks, "max_tokens": max_tokens,
                               "threads_per_executor": THREADS,
                               "bid_window_ms": TasksSection().bid_window_ms}
    backend = load_backend(ModelConfig(n_threads=THREADS))
    figures["model"] = backend.info.name
    baseline = _Baseline(backend, max_tokens)
    with tempfile.TemporaryDirectory(prefix="symphony-bench-tasks-") as tmp:
        net = LocalTestnet(Path(tmp), network_id="bench-tasks", config=FAST_MEMBERSHIP,
                           link=link)
        try:
            t0 = time.perf_counter()
            asker = _start_network(net)
            figures["network_start_s"] = round(time.perf_counter() - t0, 1)
            client = ApiClient(asker.data_dir, timeout_s=ASK_DEADLINE_MS / 1000 + 15)
            _ask(client, "What is 2 plus 2?", 3, 4)  # warm-up: the beacon topic's mesh forms
            for k in (1, 3):
                figures.update(_asks_with_k(client, questions, k, max_tokens,
                                            baseline if k == 1 else None))
            figures.update(stream_figures(asker.api_url, read_token(asker.data_dir),
                                          backend.info.name, questions, max_tokens,
                                          ASK_DEADLINE_MS / 1000 + 15))
            if not levels:
                figures.update(run_load(asker, read_token(asker.data_dir),
                                        QUICK_LOAD_ASKS if quick else FULL_LOAD_ASKS))
        finally:
            net.kill_all()
    if levels:
        figures.update(run_concurrency(backend, levels, _questions(max(levels)), max_tokens,
                                       THREADS, quick, link))
    figures["direct_solve_p50_ms"] = round(_pct(baseline.direct_ms, 0.5), 1)
    same = baseline.same_answer
    figures["k1_same_answer"] = statistics.fmean(same) if same else float("nan")
    figures["overhead_ratio_k1"] = round(
        figures["k1_total_p50_ms"] / figures["direct_solve_p50_ms"], 3)
    return figures


@dataclass
class _Baseline:
    """Calls of the model in this process, the baseline each k = 1 ask is compared with."""

    backend: Any
    max_tokens: int
    direct_ms: list[float] = field(default_factory=list)
    #: per k = 1 ask that finished: whether the network's answer equals the direct call's
    same_answer: list[bool] = field(default_factory=list)

    def solve(self, question: str) -> Any:
        """Solve ``question`` directly (timed); its normalized answer."""
        from models.cot import Problem, solve
        from protocol.answers import AnswerType

        d0 = time.perf_counter()
        sol = solve(self.backend, Problem(question, AnswerType.NUMBER),
                    max_tokens=self.max_tokens)
        self.direct_ms.append((time.perf_counter() - d0) * 1000)
        return sol.normalized


def _start_network(net: Any) -> Any:
    """The asker (no model) and three executors connected to it; the asker's handle."""
    from node.bench.tasks.settle import wait_settled

    asker = net.start("asker", config={"executor": {"solver": ""},
                                       "tasks": {"assign_base_ms": ASSIGN_BASE_MS}},
                      timeout_s=START_TIMEOUT_S)
    execs = [net.start(f"e{i}", bootstrap=[asker], wait=False, config={"executor": {
        "solver": "models", "threads": THREADS}})
        for i in range(3)]
    for node in execs:
        node.wait_ready(START_TIMEOUT_S)
    net.wait_all_connected(START_TIMEOUT_S)
    wait_settled(net, execs, START_TIMEOUT_S)  # start-up work must not meet the measured asks
    return asker


def _asks_with_k(client: Any, questions: list[str], k: int, max_tokens: int,
                 baseline: _Baseline | None) -> dict[str, Any]:
    """Ask each question with ``k`` executors; the ``k<k>_*`` figures. With a ``baseline``,
    each ask follows a direct call of the model (interleaved: the same load hits both)."""
    totals, auction, execution, voting, compute, votes = [], [], [], [], [], []
    over_slowest: list[float] = []
    for question in questions:
        direct_answer = baseline.solve(question) if baseline is not None else None
        ms, snap = _ask(client, question, k, max_tokens)
        if snap["phase"] != "done":
            continue
        if baseline is not None:
            baseline.same_answer.append(snap["answer"] == direct_answer)
        totals.append(ms)
        last = max(r["received_at_ms"] for r in snap["results"])
        auction.append(snap["first_assigned_at_ms"] - snap["created_at_ms"])
        execution.append(last - snap["first_assigned_at_ms"])
        voting.append(snap["finished_at_ms"] - last)
        compute += [r["compute_ms"] for r in snap["results"]]
        over_slowest.append(ms / max(1, max(r["compute_ms"] for r in snap["results"])))
        votes.append(len(snap["results"]))
    figures: dict[str, Any] = {
        f"k{k}_done": len(totals),
        f"k{k}_mean_votes": statistics.fmean(votes) if votes else 0.0,
        f"k{k}_compute_p50_ms": _pct(compute, 0.5),
    }
    if k > 1:
        figures[f"overhead_ratio_k{k}"] = round(_pct(over_slowest, 0.5), 3)
    for name, values in (("total", totals), ("auction", auction),
                         ("execution", execution), ("voting", voting)):
        figures[f"k{k}_{name}_p50_ms"] = round(_pct(values, 0.5), 1)
        figures[f"k{k}_{name}_p99_ms"] = round(_pct(values, 0.99), 1)
    return figures
