"""The executor service runs one solver thread per slot: a job cancelled while it waits for
the backend never reaches the solver, and the next job starts once the abandoned thread ends.

Without the per-slot limit each job got its own thread at once, parked on the backend's lock;
a cancelled one still ran in full once the lock was free, so the jobs behind it waited for
work nobody wanted, and their measured time (which bids learn their estimate from) grew."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import structlog
import trio
import trio.testing

from crypto.keys import Identity
from node.market.executor import ExecutorSection, ExecutorService
from protocol.market.events import CancelCompute, ComputeDone, ComputeFailed, StartCompute
from protocol.market.messages import Requirement, TaskSpec
from protocol.market.offers import ServedModel
from tests.node.trio_support import trio_test

MODEL = ServedModel("m", "f", 2048, b"\x11" * 32, 100.0, 0.0)
WAIT_S = 10


def _task(i: int) -> StartCompute:
    spec = TaskSpec(task_id=bytes([i]) * 32, requester="r", question="2+2?",
                    answer_type="number", choices=(),
                    requirement=Requirement(model="", family="", min_context=0), k=1,
                    max_price=1.0, max_tokens=4)
    return StartCompute(task=spec, attempt=0, model=MODEL.name, deadline_at_ms=10**9)


class _GatedSolver:
    """Records each task it is asked to solve; the first waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = trio.Event()
        self.calls: list[bytes] = []

    def models(self) -> list[ServedModel]:
        return [MODEL]

    def solve(self, task: TaskSpec, model: str, max_tokens: int, attempt: int) -> ComputeDone:
        self.calls.append(task.task_id)
        if len(self.calls) == 1:
            trio.from_thread.run_sync(self.entered.set)
            self.gate.wait(WAIT_S)
        return ComputeDone(task_id=task.task_id, attempt=attempt, answer="4", cot="c",
                           confidence=1.0, tokens=1, compute_ms=1, model_hash=MODEL.model_hash)


def _service() -> tuple[ExecutorService, list[object], trio.Event]:
    """The executor service on a bare context; the events it submits, and an event set at
    each."""
    done: list[object] = []
    arrived = trio.Event()

    async def submit(name: str, event: object) -> None:
        done.append(event)
        arrived.set()

    config = SimpleNamespace(section=lambda name: {"executor": ExecutorSection(slots=1)}[name])
    ctx = SimpleNamespace(identity=Identity.from_seed(b"\x01" * 32), network_id="t",
                          data_dir=Path("."), config=config, db=None, transport=None,
                          log=structlog.get_logger(), rng=random.Random(1), clock=lambda: 0,
                          submit=submit, services={})
    return ExecutorService(ctx), done, arrived  # type: ignore[arg-type]


@trio_test
async def test_a_job_cancelled_while_waiting_for_the_solver_never_runs() -> None:
    service, done, arrived = _service()
    solver = _GatedSolver()
    service.solver = solver
    first, second, third = _task(1), _task(2), _task(3)
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.perform(first)
            await solver.entered.wait()  # the first job is in the solver
            await service.perform(second)
            await trio.testing.wait_all_tasks_blocked()
            for job in (first, second):  # the first is abandoned in its thread
                await service.perform(CancelCompute(job.task.task_id, 0))
            await service.perform(third)
            solver.gate.set()
            await arrived.wait()
            nursery.cancel_scope.cancel()
    assert solver.calls == [first.task.task_id, third.task.task_id]
    assert [e.task_id for e in done if isinstance(e, ComputeDone)] == [third.task.task_id]


class _MisdirectedSolver:
    """Answers with what ``answer(task, attempt)`` builds, right or not."""

    def __init__(self, answer: Callable[[TaskSpec, int], object]) -> None:
        self.answer = answer

    def models(self) -> list[ServedModel]:
        return [MODEL]

    def solve(self, task: TaskSpec, model: str, max_tokens: int, attempt: int) -> object:
        return self.answer(task, attempt)


def _done(task: TaskSpec, attempt: int) -> ComputeDone:
    return ComputeDone(task_id=task.task_id, attempt=attempt, answer="4", cot="c",
                       confidence=1.0, tokens=1, compute_ms=1, model_hash=MODEL.model_hash)


@pytest.mark.parametrize(("answer", "reason"), [
    (lambda task, attempt: _done(task, attempt + 1), "a result for task 0101"),
    (lambda task, attempt: _done(_task(9).task, attempt), "a result for task 0909"),
    (lambda task, attempt: {"answer": "4"}, "solver returned dict"),
])
@trio_test
async def test_a_solver_result_for_another_job_is_a_failure(
        answer: Callable[[TaskSpec, int], object], reason: str) -> None:
    service, done, arrived = _service()
    service.solver = _MisdirectedSolver(answer)
    job = _task(1)
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await service.perform(job)
            await arrived.wait()
            nursery.cancel_scope.cancel()
    (failed,) = done
    assert isinstance(failed, ComputeFailed) and failed.task_id == job.task.task_id
    assert reason in failed.reason and service.failed == 1 and service.computed == 0
