"""Requests a machine gave up waiting for, whose answers may still come (pure).

A peer short of CPU answers late, and a send can be reported failed after the request went
out, so an answer to a request given up on less than ``window_ms`` ago is no fault: the one
rule that discovery (its queries) and the ledger's sync sessions (their pulls) share. Each
request given up on excuses one answer; entries older than the window are dropped as new ones
are added, so the table holds at most the requests given up on within one window.
"""

from __future__ import annotations


class GivenUp:
    """Peer -> when we gave up on our request to it, for one window."""

    __slots__ = ("_at", "window_ms")

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._at: dict[str, int] = {}

    def add(self, peer: str, now: int) -> None:
        """We stopped waiting for ``peer``'s answer at ``now``."""
        for p in [p for p, at in self._at.items() if now - at >= self.window_ms]:
            del self._at[p]
        self._at[peer] = now

    def excuses(self, peer: str, now: int) -> bool:
        """Whether an answer from ``peer`` that we no longer await answers a request we gave
        up on within the window (once: a second answer is not excused)."""
        at = self._at.pop(peer, None)
        return at is not None and now - at < self.window_ms

    def forget(self, peer: str) -> None:
        self._at.pop(peer, None)
