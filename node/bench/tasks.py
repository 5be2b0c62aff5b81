"""`symphony bench tasks`: time from ask to answer on a local network of real daemons.

Four daemons on loopback (separate processes): one asks, three execute with a solver that
takes a fixed time per task (node/bench/arith_solver.py, ``SOLVE_MS``), so the figures are
the network path's own cost: beacon + bids (auction), assignment to the last result
(execution, which includes the solver's time), and the vote. For k = 1 and k = 3 it reports
p50/p99 of the total as seen by the HTTP client and of each phase from the task snapshot,
and ``overhead_ratio_k1``: the p50 ask time with k = 1 over the p50 time of calling the same
solver directly in this process, measured in the same run.

The auction closes when k + 1 bids are in (one spare): with three executors a k = 3 ask
waits for its bid window (``BID_WINDOW_MS``), which the k3 figures show.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from node.bench.arith_solver import DELAY_ENV, ArithmeticSolver

SOLVE_MS = 200
BID_WINDOW_MS = 1_000
QUESTION = "What is {a} * {b}?"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _direct_ms(runs: int) -> list[float]:
    from protocol.tasks import Requirement, TaskSpec

    solver = ArithmeticSolver(SOLVE_MS)
    spec = TaskSpec(task_id=b"\0" * 32, requester="", question=QUESTION.format(a=6, b=7),
                    answer_type="number", choices=(),
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=1.0, max_tokens=256)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        solver.solve(spec, "test-arith", 256)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _ask(client: Any, k: int, i: int) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    snap: dict[str, Any] = client.post("/tasks/", {
        "question": QUESTION.format(a=i + 2, b=i + 3), "answer_type": "number", "k": k,
        "deadline_ms": 30_000})
    return (time.perf_counter() - t0) * 1000, snap


def run(quick: bool) -> dict[str, Any]:
    from node.control import ApiClient
    from node.testnet import LocalTestnet

    asks = 4 if quick else 20
    figures: dict[str, Any] = {"solve_ms": SOLVE_MS, "asks_per_k": asks,
                               "bid_window_ms": BID_WINDOW_MS}
    with tempfile.TemporaryDirectory(prefix="symphony-bench-tasks-") as tmp:
        net = LocalTestnet(Path(tmp), network_id="bench-tasks",
                           config={"membership": {"ping_interval_ms": 1000,
                                                  "exchange_interval_ms": 500}})
        try:
            asker = net.start("asker", config={"tasks": {"bid_window_ms": BID_WINDOW_MS}})
            execs = [net.start(f"e{i}", bootstrap=[asker], wait=False, env={
                DELAY_ENV: str(SOLVE_MS)}, config={"executor": {
                    "solver": "node.bench.arith_solver:factory"}}) for i in range(3)]
            for node in execs:
                node.wait_ready()
            net.wait_all_connected(60)
            client = ApiClient(asker.data_dir, timeout_s=60)
            _ask(client, 3, 100)  # warm-up: lets the beacon topic's gossip mesh form
            for k in (1, 3):
                totals, auction, execution, voting, votes = [], [], [], [], []
                for i in range(asks):
                    ms, snap = _ask(client, k, i)
                    if snap["phase"] != "done":
                        continue
                    totals.append(ms)
                    last = max(r["received_at_ms"] for r in snap["results"])
                    auction.append(snap["first_assigned_at_ms"] - snap["created_at_ms"])
                    execution.append(last - snap["first_assigned_at_ms"])
                    voting.append(snap["finished_at_ms"] - last)
                    votes.append(len(snap["results"]))
                figures[f"k{k}_done"] = len(totals)
                figures[f"k{k}_mean_votes"] = statistics.fmean(votes) if votes else 0.0
                for name, values in (("total", totals), ("auction", auction),
                                     ("execution", execution), ("voting", voting)):
                    figures[f"k{k}_{name}_p50_ms"] = _pct(values, 0.5)
                    figures[f"k{k}_{name}_p99_ms"] = _pct(values, 0.99)
        finally:
            net.kill_all()
    direct = _direct_ms(asks)
    figures["direct_solve_p50_ms"] = _pct(direct, 0.5)
    figures["overhead_ratio_k1"] = figures["k1_total_p50_ms"] / figures["direct_solve_p50_ms"]
    return figures
