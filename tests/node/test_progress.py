"""The CLI's live view of an ask (node/cli/progress.py): what the panel shows as a task moves,
and `symphony ask` without --json against real daemons (its live panel is for terminals;
through a pipe only the final result is printed)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from node.cli import progress
from node.cli.progress import follow_task, task_view

from .conftest import ARITH_SOLVER, Testnet, run_cli

PEER_A = "12D3KooWAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
PEER_B = "12D3KooWBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"


def snapshot(phase: str, *, answered: bool) -> dict[str, Any]:
    results = [{"executor": p, "answer": "42", "tokens": 12} for p in (PEER_A, PEER_B)]
    return {
        "task_id": "ab" * 16, "phase": phase, "round": 0, "k": 2,
        "attempts": [{"peer": p, "state": "answered" if answered else "assigned"}
                     for p in (PEER_A, PEER_B)],
        "results": results if answered else [],
        "votes": [{"answer": "42", "count": 2, "share": 1.0}] if answered else [],
    }


LIVE = {"bids": [{"peer": PEER_A, "match": 0.5, "price": 0.0},
                 {"peer": PEER_B, "match": 0.5, "price": 0.0}],
        "verification": [{"executor": PEER_A, "verifier": None, "outcome": "passed",
                          "final": True}]}


def render(renderable: Any) -> str:
    console = Console(record=True, width=120)
    console.print(renderable)
    return console.export_text()


def test_the_panel_shows_bids_executors_and_then_votes() -> None:
    running = render(task_view(snapshot("running", answered=False), LIVE, 1.5))
    assert "bids (2)" in running and "12D3KooW…AAAAAA" in running
    assert "assigned" in running and "votes" not in running
    done = render(task_view(snapshot("done", answered=True), LIVE, 2.0))
    assert "answered" in done and "42" in done and "100%" in done
    assert "passed" in done  # the verification outcome of executor A


def test_follow_task_polls_until_the_task_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "POLL_S", 0.0)
    phases = iter(["bidding", "running", "done"])
    asked: list[str] = []

    def get(path: str) -> dict[str, Any]:
        asked.append(path)
        if path.startswith("/dashboard/live/"):
            return LIVE
        phase = next(phases)
        return snapshot(phase, answered=phase == "done")

    console = Console(record=True, width=120, force_terminal=True)
    snap = follow_task(get, "ab" * 16, timeout_s=30, console=console)
    assert snap["phase"] == "done"
    assert asked.count(f"/tasks/{'ab' * 16}") == 3
    assert asked.count(f"/dashboard/live/{'ab' * 16}") == 3


@pytest.mark.integration
def test_ask_without_json_prints_the_result(testnet: Testnet) -> None:
    asker = testnet.start("asker", config={"tasks": {"bid_window_ms": 1500, "max_rounds": 8,
                                                     "min_round_ms": 500}})
    testnet.start("e1", bootstrap=[asker], config={"executor": {"solver": ARITH_SOLVER}})
    testnet.wait_all_connected(60)
    shown = run_cli("ask", "What is 6 * 7?", "--k", "1", "--answer-type", "number",
                    "--deadline-ms", "40000", data_dir=asker.data_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "answer: 42" in shown.stdout and "who computed what" in shown.stdout
