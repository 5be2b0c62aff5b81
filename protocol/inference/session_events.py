"""The session machine's events and effects (protocol.inference.session's contract), apart
from the machine so that the driver and tests name them without the machine's rules."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.inference.messages import Precision


@dataclass(frozen=True, slots=True)
class ForwardDone:
    session_id: bytes
    start_pos: int
    n: int
    data: bytes
    compute_ms: int
    #: the K/V rows the step appended (protocol.inference.recheck's layout): committed to
    kv: bytes


@dataclass(frozen=True, slots=True)
class ForwardFailed:
    session_id: bytes
    #: True when the input was at fault (non-finite values): the sender is penalized
    bad_input: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Misbehaved:
    """A peer broke the session protocol where the machine does not see it: a server that
    answered a requester with hidden states of the wrong shape, non-finite values or a
    truncated frame, or a requester whose stream carried bytes that are no message."""

    peer: str
    detail: str


@dataclass(frozen=True, slots=True)
class RunForward:
    """Run blocks [start, end) on ``data`` (n positions from start_pos) in the session's cache."""

    peer: str
    session_id: bytes
    start: int
    end: int
    start_pos: int
    n: int
    data: bytes
    precision: Precision


@dataclass(frozen=True, slots=True)
class CropCache:
    session_id: bytes
    length: int


@dataclass(frozen=True, slots=True)
class FreeCache:
    session_id: bytes
