"""The figures the dashboard derives for its charts (node/api/dashboard_jobs.py): tokens/s per
inference stage and for the chain this node would plan, an RL run's groups per policy version
with their staleness, and the running totals the page turns into rates. The browser test
(tests/node/test_dashboard_browser.py) draws them from real daemons."""

from __future__ import annotations

from typing import Any

import pytest

from node.api.dashboard_jobs import (
    MAX_RL_VERSIONS,
    RunHistory,
    Throughput,
    inference_view,
    rl_view,
    tokens_per_s,
)
from node.api.dashboard_state import LiveFeed, dashboard_state
from protocol.inference.routing import Server, missing_blocks
from protocol.machine import Emit
from protocol.market.events import ComputeDone, TaskUpdated
from protocol.market.state import TaskSnapshot

ME, A, B = "12D3KooWme", "12D3KooWa", "12D3KooWb"
MODEL = "m"


def _server(peer: str, start: int, end: int, ms_per_block: float) -> Server:
    return Server(peer=peer, model=MODEL, start=start, end=end, ms_per_block=ms_per_block,
                  free_sessions=4, max_sessions=4, free_cache_bytes=1 << 30)


class _Inference:
    """What inference_view reads of node.inference.service.InferenceService."""

    model_name = MODEL
    n_blocks = 30

    def __init__(self, servers: list[Server], rtts: dict[str, float]) -> None:
        self.servers, self.rtts = servers, rtts

    def status(self) -> dict[str, Any]:
        own = [s for s in self.servers if s.peer == ME]
        return {"serving": bool(own), "blocks": [own[0].start, own[0].end] if own else None,
                "ms_per_block": own[0].ms_per_block if own else 0.0, "sessions": 0,
                "forwards": 0, "problem": ""}

    def chain_servers(self) -> list[Server]:
        return self.servers

    def rtt_ms(self) -> dict[str, float]:
        return self.rtts

    def missing(self) -> list[tuple[int, int]]:
        return missing_blocks(self.servers, MODEL, self.n_blocks)


def test_stages_and_the_planned_chain_with_their_tokens_per_second() -> None:
    # this node serves 0-10 at 2 ms/block; A 10-30 at 1 ms/block (pinged 20 ms); B 10-30 at
    # 4 ms/block (never pinged): the chain is ME then A
    servers = [_server(ME, 0, 10, 2.0), _server(A, 10, 30, 1.0), _server(B, 10, 30, 4.0)]
    view = inference_view(_Inference(servers, {A: 20.0}), ME)
    assert view is not None and view["serving"] and view["blocks"] == [0, 10]
    stages = {s["peer"]: s for s in view["stages"]}
    assert stages[ME]["self"] and stages[ME]["tokens_per_s"] == 50.0  # 1000 / (10 * 2)
    assert stages[A]["tokens_per_s"] == 50.0 and stages[A]["rtt_ms"] == 20.0
    assert stages[B]["tokens_per_s"] == 12.5 and stages[B]["rtt_ms"] is None
    chain = view["chain"]
    assert [(h["peer"], h["start"], h["end"]) for h in chain["hops"]] == [(ME, 0, 10), (A, 10, 30)]
    assert chain["hops"][0]["rtt_ms"] == 0.0 and chain["hops"][0]["self"]
    assert chain["hops"][1]["rtt_measured"] and not chain["hops"][1]["self"]
    # 20 ms of compute here, 20 ms there plus its 20 ms round trip
    assert chain["ms_per_token"] == 60.0 and chain["tokens_per_s"] == pytest.approx(16.67)
    assert view["missing"] == [] and view["chain_problem"] is None


def test_blocks_no_one_serves_leave_no_chain() -> None:
    view = inference_view(_Inference([_server(A, 0, 20, 1.0)], {}), ME)
    assert view is not None
    assert view["chain"] is None and view["missing"] == [[20, 30]]
    assert "no chain covers the model" in view["chain_problem"]
    assert inference_view(None, ME) is None
    assert tokens_per_s(0.0) is None  # a stage that measured nothing has no speed


def _rl(event: str, **fields: object) -> Emit:
    return Emit(event, fields)


def test_an_rl_runs_groups_per_version_with_their_staleness() -> None:
    runs = RunHistory()
    runs.observe(_rl("rl.accepted", version=1, training=1), 100)
    runs.observe(_rl("rl.version", version=2), 200)
    runs.observe(_rl("rl.accepted", version=1, training=2), 300)
    runs.observe(_rl("rl.accepted", version=2, training=2), 310)
    runs.observe(_rl("rl.stale", version=0, training=2), 320)
    runs.observe(_rl("rl.assigned", version=2), 330)  # not a group's verdict
    one, two = runs.rows()
    assert one == {"version": 1, "published_at_ms": None, "accepted": 1, "stale": 0,
                   "staleness": {"0": 1}}
    assert two == {"version": 2, "published_at_ms": 200, "accepted": 2, "stale": 1,
                   "staleness": {"1": 1, "0": 1}}
    for v in range(3, MAX_RL_VERSIONS + 10):
        runs.observe(_rl("rl.version", version=v), v)
    assert len(runs.rows()) == MAX_RL_VERSIONS and runs.rows()[-1]["version"] == v


class _Status:
    def __init__(self, status: dict[str, Any]) -> None:
        self._status = status

    def status(self) -> dict[str, Any]:
        return self._status


def test_the_rl_view_shows_the_book_the_worker_and_reported_steps() -> None:
    assert rl_view({}, RunHistory()) is None
    book = {"version": 3, "staleness": 1, "in_flight": 2, "waiting_groups": 0,
            "dropped_groups": 0, "excluded": [], "book": {"accepted": 5}, "counters": {}}
    view = rl_view({"rl_jobs": _Status(book)}, RunHistory())
    assert view is not None and view["learner"]["version"] == 3 and view["worker"] is None
    assert view["steps"] == []  # no learner step reported: no reward curve
    steps = [{"version": 1, "mean_reward": 0.25}, {"version": 2, "mean_reward": 0.5,
                                                     "heldout_accuracy": 0.4}]
    view = rl_view({"rl_jobs": _Status({**book, "steps": steps}),
                    "rl_worker": _Status({"enabled": True, "generated": 4})}, RunHistory())
    assert view is not None and view["worker"]["generated"] == 4
    assert view["steps"] == [
        {"version": 1, "mean_reward": 0.25, "heldout_accuracy": None},
        {"version": 2, "mean_reward": 0.5, "heldout_accuracy": 0.4}]


def _done(task_id: str, phase: str, tokens: list[int]) -> TaskUpdated:
    return TaskUpdated(TaskSnapshot({"task_id": task_id, "phase": phase,
                                     "results": [{"tokens": t} for t in tokens]}))


def test_totals_count_each_ended_task_once_and_the_tokens_computed() -> None:
    totals = Throughput()
    assert totals.observe(_done("t1", "running", [5])) is False
    assert totals.observe(_done("t1", "done", [5, 7]))
    assert totals.observe(_done("t1", "done", [5, 7])) is False  # shown again: counted once
    assert totals.observe(_done("t2", "failed", []))
    assert totals.observe(ComputeDone(task_id=b"x", attempt=0, answer="6", cot="", confidence=1.0,
                                      tokens=9, compute_ms=3, model_hash=b""))
    assert totals.totals == {"tasks_ended": 2, "answer_tokens": 12, "tasks_computed": 1,
                             "tokens_generated": 9}


class _Source:
    services: dict[str, Any] = {}

    def status(self) -> dict[str, Any]:
        return {"peer_id": ME, "peers": []}


def test_the_state_carries_the_totals_with_the_clock() -> None:
    feed = LiveFeed(lambda: 1234)
    feed.observe("tasks", _done("t1", "done", [3]))
    feed.observe("rl_jobs", _rl("rl.version", version=4))
    state = dashboard_state(_Source(), feed)
    assert state["totals"] == {"tasks_ended": 1, "answer_tokens": 3, "tasks_computed": 0,
                               "tokens_generated": 0, "at_ms": 1234}
    assert state["inference"] is None and state["rl"] is None  # no such service here
    assert feed.runs.rows()[0]["published_at_ms"] == 1234
