"""The outcome of one doctor check, and how a list of them is summed up.

A check passes, fails (the node will not work as configured: the exit status is non-zero),
warns (it works, with less: no GPU, not reachable from outside) or is skipped because it needs
something absent (the running daemon). Every outcome but a pass carries a ``fix``: the command
or setting that changes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PASS = "pass"
FAIL = "fail"
WARN = "warn"
SKIP = "skip"
STATUSES = (PASS, FAIL, WARN, SKIP)


@dataclass(frozen=True, slots=True)
class Check:
    #: what was checked, e.g. "key", "bootstrap /ip4/1.2.3.4/tcp/4001/p2p/12D3..."
    name: str
    status: str
    #: what was found, in one line
    detail: str
    #: how to change a failure, warning or skip ("" for a pass)
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check status {self.status!r} is not one of {STATUSES}")

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == FAIL]


def summary(checks: list[Check]) -> dict[str, int]:
    """How many checks ended in each status."""
    return {status: sum(1 for c in checks if c.status == status) for status in STATUSES}
