"""The simulator against the real daemon: the same workload gives the same protocol outcome.

One requester and three executors answer "What is 6 * 7?" with k = 3, once as real daemons on
loopback (separate processes, libp2p) and once as virtual nodes running the same machines on
the same solvers (simulations.compute.cost.SolverBackend). One executor runs the honest test
solver (tests/node/arith_solver.py, "42" with confidence 0.9); two run the dissenting one
(tests/node/dissenting_solver.py, "43" with confidence 0.05). Counted by heads "43" would
win; weighted by confidence the honest "42" does. Both runs must end done, not partial, with
"42", the same vote table (answers, counts, weights) and the same ballots from three
distinct executors: a pipeline that loses an answer, a confidence or a weight on the way
gives another table, and one that counts heads another winner.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pytest

from protocol.market.events import AuctionConfig, SubmitTask
from protocol.market.executor import MATCH_ANY, ExecutorConfig
from protocol.market.selection import ScoreSelector
from simulations.compute.cost import SolverBackend
from simulations.machines.market import AUCTION, SNAPSHOTS, auction_spec, executor_spec
from simulations.network import LatencyModel
from simulations.swarm import Swarm
from tests.node.arith_solver import DELAY_ENV, ArithmeticSolver
from tests.node.conftest import (  # noqa: F401  (testnet: the fixture)
    ARITH_SOLVER,
    CONVERGE_S,
    TASKS,
    Testnet,
    run_cli,
    testnet,
)
from tests.node.dissenting_solver import DISSENT_CONFIDENCE, DissentingSolver

QUESTION = "What is 6 * 7?"
DISSENTING_SOLVER = "tests.node.dissenting_solver:factory"
#: both vote weights are products of floats computed the same way; compare them to 1e-9
WEIGHT_DIGITS = 9
SEEDS = (1, 2, 3)
#: virtual time each simulated executor computes for
COMPUTE_MS = 50


def outcome(snap: dict[str, Any]) -> dict[str, Any]:
    """What the daemon and the simulator must agree on, from a task snapshot
    (protocol.market.state.snapshot): executors' peer ids differ between the two runs, so
    ballots are compared as a sorted list and executors by their number."""
    return {
        "phase": snap["phase"],
        "answer": snap["answer"],
        "partial": snap["partial"],
        "votes": [(v["answer"], v["count"], round(v["weight"], WEIGHT_DIGITS))
                  for v in snap["votes"]],
        "ballots": sorted((r["answer"], r["normalized"], r["confidence"],
                           round(r["weight"], WEIGHT_DIGITS)) for r in snap["results"]),
        "executors": len({r["executor"] for r in snap["results"]}),
    }


class VirtualTimeSolver:
    """A test solver that reports the virtual compute time it is given instead of the wall
    time it measured, so a result (and the signature over it) depends on the seed only."""

    def __init__(self, solver: ArithmeticSolver, compute_ms: int) -> None:
        self.solver = solver
        self.compute_ms = compute_ms

    def solve(self, task: Any, model: str, max_tokens: int, attempt: int) -> Any:
        solution = self.solver.solve(task, model, max_tokens, attempt)
        return dataclasses.replace(solution, compute_ms=self.compute_ms)


def simulated_run(seed: int) -> tuple[dict[str, Any], list[tuple[int, str, str]]]:
    """The task's final snapshot and every event the swarm emitted, ``(ms, node, event)``."""
    honest, dissenter = ArithmeticSolver(delay_ms=0), DissentingSolver(delay_ms=0)
    models = tuple(honest.models())
    config = AuctionConfig(bid_window_ms=1500)
    auc = auction_spec(lambda node: ScoreSelector(), config)
    specs = [executor_spec(lambda node: ExecutorConfig(models=models, slots=1),
                           SolverBackend(VirtualTimeSolver(solver, COMPUTE_MS)))
             for solver in (honest, dissenter, dissenter)]
    emitted: list[tuple[int, str, str]] = []
    swarm = Swarm(seed, latency=LatencyModel("uniform", 1.0, 5.0))
    asker = swarm.add_node((auc,))
    execs = [swarm.add_node((spec,)) for spec in specs]
    for node in (asker, *execs):
        swarm.start(node)
    rng = random.Random(seed)
    for node in execs:
        swarm.connect(asker, node)
        swarm.connect_random(node, 2, rng)
    for event in ("task.done", "task.failed", "task.assigned"):
        swarm.on_emit(event, lambda node, f, now, event=event: emitted.append(
            (now, node.identity.peer_id, event)))
    swarm.at_ms(100, asker.submit, AUCTION,
                SubmitTask(question=QUESTION, answer_type="number", deadline_ms=40_000, k=3))
    swarm.run(60_000)
    (snapshot,) = asker.store[SNAPSHOTS].values()
    return snapshot.to_dict(), emitted


def expected_outcome() -> dict[str, Any]:
    """The outcome worked out by hand from protocol.market.voting's weight formula."""
    from protocol.market.voting import Ballot, ballot_weight

    def weight(confidence: float) -> float:
        # a new executor's reputation is the neutral 0.5; a task that names no model is
        # matched by any (MATCH_ANY)
        return ballot_weight(Ballot("", "", confidence, 0.5, MATCH_ANY))

    honest, dissent = (round(weight(c), WEIGHT_DIGITS) for c in (0.9, DISSENT_CONFIDENCE))
    dissent_row = round(weight(DISSENT_CONFIDENCE) * 2, WEIGHT_DIGITS)
    return {
        "phase": "done", "answer": "42", "partial": False,
        "votes": [("42", 1, honest), ("43", 2, dissent_row)],
        "ballots": [("42", "42", 0.9, honest), ("43", "43", DISSENT_CONFIDENCE, dissent),
                    ("43", "43", DISSENT_CONFIDENCE, dissent)],
        "executors": 3,
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_the_simulated_market_is_right_and_deterministic_per_seed(seed: int) -> None:
    snap, emitted = simulated_run(seed)
    assert outcome(snap) == expected_outcome(), f"seed {seed}"
    assert [e for _, _, e in emitted].count("task.done") == 1, f"seed {seed}: {emitted}"
    # the same seed replays the same run: every snapshot field (ids, times, signed bytes) and
    # every emitted event at the same virtual millisecond
    assert simulated_run(seed) == (snap, emitted), f"seed {seed}"


def test_seeds_change_the_run_but_not_the_outcome() -> None:
    runs = [simulated_run(seed) for seed in SEEDS]
    assert len({json.dumps(snap, sort_keys=True) for snap, _ in runs}) == len(SEEDS)
    assert all(outcome(snap) == outcome(runs[0][0]) for snap, _ in runs)


@pytest.mark.integration
def test_simulated_and_real_daemons_reach_the_same_outcome(testnet: Testnet) -> None:  # noqa: F811
    asker = testnet.start("asker", config={"tasks": TASKS})
    execs = [testnet.start(name, bootstrap=[asker], wait=False, env={DELAY_ENV: "50"},
                           config={"executor": {"solver": solver, "hold_ms": 5000}})
             for name, solver in (("e1", ARITH_SOLVER), ("e2", DISSENTING_SOLVER),
                                  ("e3", DISSENTING_SOLVER))]
    for node in execs:
        node.wait_ready()
    testnet.wait_all_connected(CONVERGE_S)
    shown = run_cli("ask", QUESTION, "--k", "3", "--answer-type", "number", "--json",
                    "--deadline-ms", "40000", data_dir=asker.data_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    real = outcome(json.loads(shown.stdout))
    assert real == outcome(simulated_run(1)[0]) == expected_outcome()
