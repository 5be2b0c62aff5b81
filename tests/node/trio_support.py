"""What the p2p tests share: a trio test runner with a deadline, and a recorder of the faults a
transport reports."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import trio

#: a trio test fails past this many seconds instead of hanging the suite
TEST_DEADLINE_S = 60


def trio_test(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        async def bounded() -> None:
            with trio.fail_after(TEST_DEADLINE_S):
                await fn(*args, **kwargs)

        trio.run(bounded)

    return run


class Faults:
    """The faults a transport reports, and a wait for the n-th (no sleeping)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._grew = trio.Event()

    def __call__(self, peer: str, kind: str, detail: str) -> None:
        self.seen.append((kind, detail))
        self._grew.set()
        self._grew = trio.Event()

    @property
    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.seen]

    async def wait(self, n: int) -> None:
        with trio.fail_after(10):
            while len(self.seen) < n:
                await self._grew.wait()
