"""`symphony demo`: the evaluation set through a real local network, and how it counts.

A single executor's accuracy counts every executor's own answer, including the ones the
requester refused because they did not parse (it replaced those executors); the end-to-end
run uses the real default model with a tiny budget, so it checks the plumbing and the
output, not the model's accuracy."""

from __future__ import annotations

from typing import Any

import pytest

from node.cli.demo import UNPARSEABLE, ballots_of

from .conftest import run_cli


def snap(results: list[str | None], failed: list[str]) -> dict[str, Any]:
    return {"results": [{"normalized": n} for n in results],
            "attempts": [{"state": "failed", "reason": r} for r in failed]
            + [{"state": "answered", "reason": ""} for _ in results]}


@pytest.mark.parametrize("results,failed,expected", [
    (["42", "42", "41"], [], ["42", "42", "41"]),
    (["42"], [UNPARSEABLE, UNPARSEABLE], ["42", None, None]),
    # a result whose answer did not normalize still counts, as None
    ([None, "B"], [], [None, "B"]),
    # executors lost to timeouts or disconnects gave no answer: not counted
    (["7"], ["timeout", "disconnected", "rejected:busy"], ["7"]),
    ([], [UNPARSEABLE], [None]),
])
def test_every_executor_answer_is_a_ballot(results: list[str | None], failed: list[str],
                                           expected: list[str | None]) -> None:
    assert ballots_of(snap(results, failed)) == expected


@pytest.mark.integration
def test_the_demo_runs_end_to_end_and_stops_cleanly() -> None:
    pytest.importorskip("llama_cpp")
    shown = run_cli("demo", "--executors", "1", "--questions", "2", "--max-tokens", "16",
                    timeout_s=300)
    out = shown.stdout
    assert shown.returncode == 0, out + shown.stderr
    assert "node a:" in out and "node b:" in out and "serves smollm2-135m-instruct-q4_1 (Q4_1" in out
    assert "node a (" in out and "peers:" in out  # the peers of every node come first
    assert "dashboard of node a, open while the demo runs: http://127.0.0.1:" in out
    assert "/?token=" in out
    assert out.count("expected ") == 2 and "arith-000" in out and "choice-001" in out
    assert "single executor: " in out and "voted k=3: " in out
    assert "stopped 2 nodes cleanly (exit codes [0, 0])" in out
