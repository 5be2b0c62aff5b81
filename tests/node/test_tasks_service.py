"""TasksService storage without a network: snapshots go to SQLite, an open task left by a
stopped requester is resumed from them (kept results, running attempts), a finished one is
not, and the LinUCB state survives a restart."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from node.db import Database
from node.market.requester import TasksSection, TasksService, restore_event
from protocol.market.auction import AuctionConfig, RestoreTask, TaskUpdated
from protocol.market.linucb import LinUCBSelector
from protocol.market.state import TaskSnapshot
from tests.protocol.auction_net import RecordingSelector
from tests.protocol.market_net import MarketNet


class _Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def service(db: Database, submitted: list[object], selector: str = "score") -> TasksService:
    clock = SimpleNamespace(ms=1_000_000)
    net = MarketNet(0)

    async def submit(name: str, event: object) -> None:
        submitted.append(event)

    ctx = SimpleNamespace(
        identity=net.requester, network_id="t", data_dir=Path("."), db=db, transport=None,
        log=_Log(), rng=random.Random(3), clock=lambda: clock.ms, submit=submit, services={},
        config=SimpleNamespace(section=lambda name: TasksSection(selector=selector)))
    svc = TasksService(ctx)  # type: ignore[arg-type]
    db.apply_schema(svc.schema)
    return svc


class WallClock:
    """``time.time`` under the test's control: the service stores deadlines in wall-clock
    seconds, so the time between a stop and the restart is whatever the test says."""

    def __init__(self, start_s: float) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s


def test_open_task_is_stored_and_resumed_with_its_attempts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wall = WallClock(1_700_000_000.0)
    monkeypatch.setattr(time, "time", wall)
    net = MarketNet(3, config=AuctionConfig(close_grace_ms=1_500))  # the whole window
    tid = net.submit(deadline_ms=60_000)
    net.step_to(1_550)  # three attempts running
    snap = net.last(tid)
    submitted: list[object] = []
    db = Database(tmp_path / "node.db")
    svc = service(db, submitted)
    svc.ctx.clock = lambda: net.now  # type: ignore[misc]
    trio.run(svc.perform, TaskUpdated(TaskSnapshot(snap)))
    assert svc.load(tid.hex())["phase"] == "running"  # type: ignore[index]
    assert [t["task_id"] for t in svc.recent()] == [tid.hex()]

    wall.now_s += 2.0  # the node was down for two seconds
    restarted = service(db, submitted)  # a new process on the same database
    trio.run(restarted.run)
    (event,) = submitted
    assert isinstance(event, RestoreTask) and event.spec.task_id == tid
    assert {a.peer for a in event.assigned} == set(net.peers())
    # the time left is the deadline's distance at the stop less the downtime (float seconds
    # in SQLite: within a millisecond)
    assert abs(event.remaining_ms - (60_000 - 1_550 - 2_000)) <= 1, event.remaining_ms
    attempts: list[dict[str, Any]] = snap["attempts"]  # type: ignore[assignment]
    dues = {a["peer"]: int(a["due_at_ms"]) for a in attempts}
    for attempt in event.assigned:  # each attempt keeps its distance to the deadline
        assert attempt.due_in_ms == event.remaining_ms - (60_000 - dues[attempt.peer])
    # the rebuilt event resumes the task in a fresh auction without a new beacon
    fresh = MarketNet(0)
    fresh.perform(fresh.rq, fresh.auction.handle(event, 0))
    assert fresh.auction.tasks[tid].phase.value == "running"


def test_finished_tasks_are_not_resumed(tmp_path: Path) -> None:
    net = MarketNet(3)
    tid = net.submit()
    net.step_to(40_000)
    submitted: list[object] = []
    db = Database(tmp_path / "node.db")
    svc = service(db, submitted)
    trio.run(svc.perform, TaskUpdated(TaskSnapshot(net.last(tid))))
    trio.run(service(db, submitted).run)
    assert submitted == []


def test_restore_event_survives_json(tmp_path: Path) -> None:
    net = MarketNet(3)
    tid = net.submit()
    net.step_to(1_620)  # some results in
    snap = json.loads(json.dumps(net.last(tid)))
    event = restore_event(snap, net.rq, 10_000)
    assert event.spec == net.auction.tasks[tid].spec
    assert len(event.kept) + len(event.assigned) == 3


def test_a_restored_child_task_stays_deferred() -> None:
    """A plan's planner or step (``deferred``) restored after a restart still leaves its
    attestations and rewards to the plan's vote: its own vote attests no executor's answer."""
    net = MarketNet(3)
    tid = net.submit(deferred=True)
    net.step_to(1_620)  # some results in, the vote not yet
    assert net.auction.tasks[tid].deferred and not net.attests
    snap = json.loads(json.dumps(net.last(tid)))
    event = restore_event(snap, net.rq, 20_000)
    assert event.deferred
    selector = RecordingSelector()
    fresh = MarketNet(3, selector=selector)  # same requester key, empty memory
    fresh.workers, fresh.now = net.workers, net.now
    fresh.perform(fresh.rq, fresh.auction.handle(event, fresh.now))
    assert fresh.auction.tasks[tid].deferred
    fresh.step_to(fresh.now + 40_000)
    assert fresh.last(tid)["phase"] == "done" and fresh.last(tid)["deferred"] is True
    assert [a.outcome for a in fresh.attests if a.outcome in ("completed", "wrong")] == []
    assert selector.observed == []


def test_linucb_state_is_saved_with_finished_tasks(tmp_path: Path) -> None:
    db = Database(tmp_path / "node.db")
    svc = service(db, [], selector="linucb")
    assert isinstance(svc.selector, LinUCBSelector)
    net = MarketNet(3, selector=svc.selector)
    tid = net.submit()
    net.step_to(40_000)
    svc.ctx.clock = lambda: net.now  # type: ignore[misc]
    trio.run(svc.perform, TaskUpdated(TaskSnapshot(net.last(tid))))
    again = service(db, [], selector="linucb")
    trio.run(again.start)
    assert isinstance(again.selector, LinUCBSelector)
    assert set(again.selector.model.arms) == set(net.peers())
    assert again.auction.selector is again.selector
