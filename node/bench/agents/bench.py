"""`symphony bench agents`: multi-step arithmetic word problems through the network, three ways.

Five daemons on loopback (separate processes, node/testnet.py's LocalTestnet): one asks (it
serves no model), three host the default generalist on the model (the embedded SmolLM2 unless
``--model PATH``), and one hosts only a calculator agent (``[[agents]]`` with the built-in
``calculator`` tool and the ``arithmetic`` and ``math`` skills) on the same model. The
questions are the first ``QUICK_QUESTIONS`` (``--quick``) or all of the shipped plan set
(models/data/planset.jsonl, exact answers). Each question is asked, with the same seed, as:

* ``single``: one generalist answers (k = 1, ``agent = "generalist"``);
* ``vote``: three generalists answer and vote (k = 3, ``agent = "generalist"``);
* ``plan``: plan mode (protocol/agents/pipeline.py): planners split it into steps, each step
  routed to the agent whose card fits it best (the calculator agent is in the market), the
  plans' answers voted.

An ask that fails or misses its deadline counts as wrong. The figures (report.py): each
mode's accuracy with its Wilson 95% interval, median latencies, ``steps_rerouted`` (steps
given to more than one executor), ``plans_valid_fraction`` (planners' results that parsed,
from the asker's pipeline counters) and how many steps the calculator agent ran.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from node.bench.agents.report import MODES, Outcome, PlanCounts, assemble, plan_counts

QUICK_QUESTIONS = 6
#: llama.cpp threads per model daemon (four share this machine's cores)
THREADS = 1
STEP_MAX_TOKENS = 64
ASK_DEADLINE_MS = 600_000
#: time an executor gets per attempt before being replaced: generous, so a shared machine's
#: load shows as latency, not as reroutes
ASSIGN_BASE_MS = 120_000
START_TIMEOUT_S = 180.0
#: the calculator agent's [[agents]] table
CALCULATOR_AGENT = "calculator"
CALCULATOR: dict[str, object] = {
    "name": CALCULATOR_AGENT, "skills": ["arithmetic", "math"], "tools": ["calculator"],
    "description": "Exact arithmetic: adds, subtracts, multiplies and divides numbers "
                   "exactly with a calculator."}
#: what the modes send beside the question (the same seed for all)
MODE_FIELDS: dict[str, dict[str, Any]] = {
    "single": {"k": 1, "agent": "generalist"},
    "vote": {"k": 3, "agent": "generalist"},
    "plan": {"mode": "plan"},
}


def _questions(n: int | None) -> list[tuple[str, str]]:
    """(question, exact normalized answer) of the plan set's first ``n`` items (all: None)."""
    from models.evalset import load_evalset
    from models.planset import PLANSET_PATH

    items = load_evalset(PLANSET_PATH)
    return [(it.problem.question, it.answer) for it in items[:n]]


def _correct(snap: dict[str, Any], expected: str) -> bool:
    from protocol.answers import AnswerType, normalize_answer

    if snap.get("phase") != "done":
        return False
    return normalize_answer(AnswerType.NUMBER, str(snap.get("answer", ""))) == expected


def run(quick: bool, model: str = "", seed: int = 0) -> dict[str, Any]:
    from node.control import ApiClient
    from node.testnet import FAST_MEMBERSHIP, LocalTestnet

    questions = _questions(QUICK_QUESTIONS if quick else None)
    outcomes: dict[str, list[Outcome]] = {m: [] for m in MODES}
    snaps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="symphony-bench-agents-") as tmp:
        net = LocalTestnet(Path(tmp), network_id="bench-agents", config=FAST_MEMBERSHIP)
        try:
            t0 = time.perf_counter()
            asker = _start_network(net, model)
            start_s = round(time.perf_counter() - t0, 1)
            client = ApiClient(asker.data_dir, timeout_s=ASK_DEADLINE_MS / 1000 + 30)
            before = _pipeline_counters(asker)
            for question, expected in questions:
                for mode in MODES:
                    seconds, snap = _ask(client, question, mode, seed)
                    outcomes[mode].append(Outcome(_correct(snap, expected), seconds,
                                                  snap.get("phase") == "done"))
                    if mode == "plan":
                        snaps.append(snap)
            after = _pipeline_counters(asker)
        finally:
            net.kill_all()
    counts = plan_counts(snaps, CALCULATOR_AGENT)
    counts = PlanCounts(
        steps_rerouted=counts.steps_rerouted, steps=counts.steps,
        steps_by_calculator=counts.steps_by_calculator, plans_with_steps=counts.plans_with_steps,
        plans_valid=after.get("plans_valid", 0) - before.get("plans_valid", 0),
        plans_invalid=after.get("plans_invalid", 0) - before.get("plans_invalid", 0))
    figures = assemble(len(questions), outcomes, counts)
    figures.update({"model": model or "default", "seed": seed, "network_start_s": start_s,
                    "threads_per_executor": THREADS, "step_max_tokens": STEP_MAX_TOKENS})
    return figures


def _ask(client: Any, question: str, mode: str, seed: int) -> tuple[float, dict[str, Any]]:
    """The ask's time and final snapshot; an ask the daemon refuses (an HTTP error status)
    is a failed ask, with the daemon's reply as its failure."""
    import httpx

    t0 = time.perf_counter()
    try:
        snap: dict[str, Any] = client.post("/tasks/", {
            "question": question, "answer_type": "number", "max_tokens": STEP_MAX_TOKENS,
            "deadline_ms": ASK_DEADLINE_MS, "seed": seed, **MODE_FIELDS[mode]})
    except httpx.HTTPStatusError as exc:
        snap = {"phase": "refused", "failure": exc.response.text[:300]}
    return time.perf_counter() - t0, snap


def _pipeline_counters(asker: Any) -> dict[str, int]:
    plans: dict[str, int] = asker.status()["services"]["tasks"]["plans"]
    return plans


def _start_network(net: Any, model: str) -> Any:
    """The asker (no model), three generalists and the calculator agent's node, connected;
    the asker's handle."""
    executor = {"solver": "models", "threads": THREADS, **({"model": model} if model else {})}
    asker = net.start("asker", timeout_s=START_TIMEOUT_S, config={
        "executor": {"solver": ""},
        "tasks": {"assign_base_ms": ASSIGN_BASE_MS}})  # planners get the daemon's plan_tokens
    nodes = [net.start(f"g{i}", bootstrap=[asker], wait=False, config={"executor": executor})
             for i in range(3)]
    nodes.append(net.start("calc", bootstrap=[asker], wait=False,
                           config={"executor": executor, "agents": [CALCULATOR]}))
    for node in nodes:
        node.wait_ready(START_TIMEOUT_S)
    net.wait_all_connected(START_TIMEOUT_S)
    return asker
