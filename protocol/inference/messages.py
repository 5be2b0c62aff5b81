"""Inference-session wire messages (tags 160-169), one libp2p stream per hop of a chain.

=================  ===  =====================================================================
message            tag  meaning
=================  ===  =====================================================================
SessionOpen        160  requester -> server: open a session on blocks [start, end) of model
SessionAccepted    161  server -> requester: the session is open (the limits it runs under)
SessionRefused     162  server -> requester: no session (a limit, an unknown model or range)
Forward            163  requester -> server: hidden states of positions start_pos.. (prefill
                        is a Forward at 0; a Forward below the cached length rolls back first)
ForwardResult      164  server -> requester: the stage's output for those positions
Rollback           165  requester -> server: keep the first ``length`` positions
SessionAck         166  server -> requester: a Rollback or SessionClose is done
SessionClose       167  requester -> server: the session ends, its cache is freed
SessionError       168  server -> requester: the session ended on an error (the reason)
=================  ===  =====================================================================

Hidden states travel as little-endian fp16 (or fp32, :class:`Precision`) in ``data``, row-major
(positions, hidden size): ``len(data)`` must equal ``n * hidden * itemsize`` exactly; values
must be finite (node.inference.hidden decodes and checks them; a bad frame is the sender's
fault).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from protocol.codec import MAX_FRAME_BYTES, Message, limits, message
from protocol.errors import InvalidMessage

#: the most hidden-state bytes one Forward or ForwardResult carries (it must fit one frame)
MAX_HIDDEN_BYTES = MAX_FRAME_BYTES - 4096
SESSION_ID_LEN = 16
MAX_MODEL_NAME = 128
#: no model this network serves has more blocks, positions or a wider hidden state
MAX_BLOCKS = 4096
MAX_POSITIONS = 1 << 20
MAX_HIDDEN_SIZE = 1 << 16


class Precision(enum.Enum):
    """How hidden states are encoded on the wire."""

    FP16 = "f16"
    FP32 = "f32"

    @property
    def itemsize(self) -> int:
        return 2 if self is Precision.FP16 else 4


class Refusal(enum.Enum):
    """Why a server will not open (or go on with) a session."""

    SESSIONS_FULL = "sessions_full"
    CACHE_FULL = "cache_full"
    TOO_LONG = "too_long"
    UNKNOWN_MODEL = "unknown_model"
    NOT_SERVED = "not_served"
    UNKNOWN_SESSION = "unknown_session"
    EXPIRED = "expired"
    MALFORMED = "malformed"
    COMPUTE_FAILED = "compute_failed"


@message(160)
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOpen(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)
    model: str = limits(max_len=MAX_MODEL_NAME)
    start: int = limits(lo=0, hi=MAX_BLOCKS)
    end: int = limits(lo=1, hi=MAX_BLOCKS)
    #: positions the session may hold at most (prompt + generated + drafts)
    max_length: int = limits(lo=1, hi=MAX_POSITIONS)
    precision: Precision
    hidden_size: int = limits(lo=1, hi=MAX_HIDDEN_SIZE)

    def check(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"empty block range [{self.start}, {self.end})")


@message(161)
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionAccepted(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)
    max_length: int = limits(lo=1, hi=MAX_POSITIONS)
    idle_timeout_ms: int = limits(lo=0)


@message(162)
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRefused(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)
    reason: Refusal
    detail: str = limits(max_len=256)


@message(163)
@dataclass(frozen=True, slots=True, kw_only=True)
class Forward(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)
    start_pos: int = limits(lo=0, hi=MAX_POSITIONS)
    n: int = limits(lo=1, hi=MAX_POSITIONS)
    data: bytes = limits(max_len=MAX_HIDDEN_BYTES)


@message(164)
@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardResult(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)
    start_pos: int = limits(lo=0, hi=MAX_POSITIONS)
    n: int = limits(lo=1, hi=MAX_POSITIONS)
    data: bytes = limits(max_len=MAX_HIDDEN_BYTES)
    #: the stage's compute time for this frame (the requester's routing uses it)
    compute_ms: int = limits(lo=0, hi=1 << 31)


@message(165)
@dataclass(frozen=True, slots=True, kw_only=True)
class Rollback(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)
    length: int = limits(lo=0, hi=MAX_POSITIONS)


@message(166)
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionAck(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)
    length: int = limits(lo=0, hi=MAX_POSITIONS)


@message(167)
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionClose(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)


@message(168)
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionError(Message):
    session_id: bytes = limits(size=SESSION_ID_LEN)
    reason: Refusal
    detail: str = limits(max_len=256)


#: what a requester may send on a session stream
REQUESTS = (SessionOpen, Forward, Rollback, SessionClose)
#: what a server may answer
REPLIES = (SessionAccepted, SessionRefused, ForwardResult, SessionAck, SessionError)


def max_positions_per_frame(hidden_size: int, precision: Precision) -> int:
    """The most positions one Forward can carry for this hidden size and precision."""
    return max(1, MAX_HIDDEN_BYTES // (hidden_size * precision.itemsize))


def check_hidden_size(data: bytes, n: int, hidden_size: int, precision: Precision) -> None:
    """InvalidMessage unless ``data`` holds exactly n x hidden_size values of ``precision``
    (the driver checks the values themselves are finite when it decodes them)."""
    want = n * hidden_size * precision.itemsize
    if len(data) != want:
        raise InvalidMessage(f"hidden states: {len(data)} bytes, expected {want} for "
                             f"{n} x {hidden_size} {precision.value}")
