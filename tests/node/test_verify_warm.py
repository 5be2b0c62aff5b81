"""A verifier whose node executes loads its check model as the service starts
(node/verification/service.py, ``VerifyService.warm_soon``), in the background and once, so
its first check does not outlast the requester's check timeout loading torch and the model; a
node that does not execute loads nothing until asked."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from crypto.keys import Identity
from node.logs import get_logger
from node.service import NodeContext
from node.verification.service import VerifySection, VerifyService


class Runner:
    """A deferred check runner: counts its loads and tells the test when one has ended."""

    def __init__(self, fail: bool = False) -> None:
        self.loads = 0
        self.fail = fail
        self.done = trio.Event()

    def warm(self) -> None:  # in a worker thread, as the service runs it
        self.loads += 1
        trio.from_thread.run_sync(self.done.set)
        if self.fail:
            raise RuntimeError("no model file")


def service(tmp_path: Path, executes: bool = False) -> VerifyService:
    config = SimpleNamespace(section=lambda name: VerifySection())
    executor = SimpleNamespace(solver=object() if executes else None)
    ctx = NodeContext(identity=Identity.from_seed(b"\x01" * 32), network_id="warm",
                      data_dir=tmp_path, config=config, db=None, transport=None,
                      log=get_logger(), rng=random.Random(0), clock=lambda: 0,
                      submit=None, services={"executor": executor})  # type: ignore[arg-type]
    return VerifyService(ctx)


def run_warm(svc: VerifyService, runner: Runner) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            svc.warm_soon()  # not running yet: nothing to warm in
            await trio.testing.wait_all_tasks_blocked()
            assert runner.loads == 0
            await nursery.start(svc.run)
            for _ in range(3):  # three committed results: one load
                svc.warm_soon()
            await runner.done.wait()
            await trio.testing.wait_all_tasks_blocked()
            svc.warm_soon()  # loaded: nothing more
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_the_check_model_is_loaded_once_in_the_background(tmp_path: Path) -> None:
    svc, runner = service(tmp_path), Runner()
    svc.runner = runner
    run_warm(svc, runner)
    assert runner.loads == 1


def test_a_failed_load_is_logged_and_the_service_goes_on(tmp_path: Path) -> None:
    svc, runner = service(tmp_path), Runner(fail=True)
    svc.runner = runner
    run_warm(svc, runner)  # the error does not leave the service's nursery
    assert runner.loads == 1


def test_a_node_without_a_check_runner_warms_nothing(tmp_path: Path) -> None:
    svc = service(tmp_path)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            svc.warm_soon()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert svc.runner is None and not svc._warming


@pytest.mark.parametrize("executes", [True, False])
def test_an_executing_node_warms_as_the_service_starts(tmp_path: Path, executes: bool) -> None:
    svc, runner = service(tmp_path, executes), Runner()
    svc.runner = runner

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            if executes:
                await runner.done.wait()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert runner.loads == (1 if executes else 0)
