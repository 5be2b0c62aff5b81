"""The simulator against the real daemon: the same workload gives the same protocol outcome.

One requester and three executors with the deterministic test solver (tests/node/
arith_solver.py) answer "What is 6 * 7?" with k = 3, once as real daemons on loopback
(separate processes, libp2p) and once as virtual nodes running the same machines on the same
solver (simulations.compute.SolverBackend). Both must end the task done, not partial, with the
same winning answer, the same vote table and three distinct executors.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from protocol.market.executor import ExecutorConfig
from protocol.market.selection import ScoreSelector
from protocol.market.events import AuctionConfig, SubmitTask
from simulations.adversary import unwrap
from simulations.compute import SolverBackend
from simulations.machines.market import AUCTION, auction_spec, executor_spec
from simulations.memo import shared_pure_functions
from simulations.network import LatencyModel
from simulations.swarm import Swarm
from tests.node.arith_solver import ArithmeticSolver
from tests.node.conftest import Testnet, run_cli, testnet  # noqa: F401  (the fixture)
from tests.node.test_tasks_integration import start

QUESTION = "What is 6 * 7?"


def simulated_outcome(seed: int) -> dict[str, Any]:
    solver = ArithmeticSolver(delay_ms=0)
    backend = SolverBackend(solver, time_from=lambda solution: 50)
    models = tuple(solver.models())
    exe = executor_spec(lambda node: ExecutorConfig(models=models, slots=1), backend)
    auc = auction_spec(lambda node: ScoreSelector(), AuctionConfig(bid_window_ms=1500))
    done: list[dict[str, Any]] = []
    with shared_pure_functions():
        swarm = Swarm(seed, latency=LatencyModel("uniform", 1.0, 5.0))
        asker = swarm.add_node((auc,))
        execs = [swarm.add_node((exe,)) for _ in range(3)]
        for node in (asker, *execs):
            swarm.start(node)
        rng = random.Random(seed)
        for node in execs:
            swarm.connect(asker, node)
            swarm.connect_random(node, 2, rng)
        swarm.on_emit("task.done", lambda node, f, now: done.append(f))
        swarm.at_ms(
            100,
            asker.submit,
            AUCTION,
            SubmitTask(question=QUESTION, answer_type="number", deadline_ms=40_000, k=3),
        )
        swarm.run(60_000)
    assert len(done) == 1, done
    task = next(iter(unwrap(asker.machine(AUCTION)).tasks.values()))
    assert task.outcome is not None
    return {
        "answer": task.outcome.winner,
        "partial": task.partial,
        "votes": sorted((row.answer, row.count) for row in task.outcome.rows),
        "executors": len(task.results),
    }


def test_the_simulated_market_is_deterministic_per_seed() -> None:
    assert simulated_outcome(1) == simulated_outcome(1)


@pytest.mark.integration
def test_simulated_and_real_daemons_reach_the_same_outcome(testnet: Testnet) -> None:  # noqa: F811
    asker, *execs = start(testnet)
    shown = run_cli(
        "ask",
        QUESTION,
        "--k",
        "3",
        "--answer-type",
        "number",
        "--json",
        "--deadline-ms",
        "40000",
        data_dir=asker.data_dir,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    snap = json.loads(shown.stdout)
    real = {
        "answer": snap["answer"],
        "partial": snap["partial"],
        "votes": sorted((v["answer"], v["count"]) for v in snap["votes"]),
        "executors": len({r["executor"] for r in snap["results"]}),
    }
    assert (
        real
        == simulated_outcome(1)
        == {"answer": "42", "partial": False, "votes": [("42", 3)], "executors": 3}
    )
