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
SessionError       168  server -> requester: the session ended on an error (the reason); with
                        NEXT_HOP_FAILED the session stays open (its handoff could not be sent)
Handoff            169  stage -> next stage: a stage's output, the next stage's input (signed)
HandoffRejected    170  stage -> requester: the handoff it got from upstream was bad (evidence)
Relink             171  requester -> server: a new upstream and next hop (after a replacement)
StageCommit        172  server -> requester: the stage's signed digests of a step's in and out
StatesAsk          173  requester -> server: the logged steps (inputs and outputs) up to a position
StatesReply        174  server -> requester: a page of them (protocol.inference.stage_log)
CommittedKv        175  requester -> checker: append a stage's committed K/V rows to a session
Recheck            176  requester -> checker: recompute rows at given positions on that K/V
RecheckResult      177  checker -> requester: their outputs and K/V rows (fp32)
=================  ===  =====================================================================

Stage checks (protocol/inference/stage_checks.py): after every forward a stage sends its
opener a ``StageCommit``, signed, naming the digests of the step's input and output frames and
of the keys and values (K/V) the step appended to its cache; the requester later asks for the
logged frames and K/V (``StatesAsk``), checks them against those digests, and has another
server holding the same blocks recompute the steps the unsteerable seed selects, each at its
own positions on the committed K/V (``CommittedKv`` then ``Recheck``, protocol.inference.
recheck; the seed's nonce is fixed in ``SessionOpen.check_nonce_hash``).

Stage-to-stage forwarding: a session may be opened with a next hop (``next_peer``,
``next_session``) and an ``upstream`` peer. A ``Forward`` with ``reply`` false then makes the
stage send its output on to the next hop as a ``Handoff`` (over the stage's own stream to that
peer) instead of answering; the next stage computes and hands off again, and the last stage (no
next hop) answers its opener with a ``ForwardResult``: N + 1 links a step instead of 2 N. A
handoff is signed by its sender over :func:`handoff_signing_bytes` (the receiving session, the
requester's step number, the positions and a digest of the data), so a stage that gets a bad
handoff can prove to the requester who sent it (``HandoffRejected`` carries the signed frame;
protocol.inference.forwarding judges it).

Hidden states travel as little-endian fp16 (or fp32, :class:`Precision`) in ``data``, row-major
(positions, hidden size): ``len(data)`` must equal ``n * hidden * itemsize`` exactly; values
must be finite (node.inference.hidden decodes and checks them; a bad frame is the sender's
fault).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from crypto.hashing import digest
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
MAX_PEER_ID = 128
SIGNATURE_LEN = 64
DIGEST_LEN = 32
#: one StatesReply's step table, inputs, outputs and K/V together stay within a frame (and so
#: do a Recheck's rows and a RecheckResult's outputs and K/V rows, a CommittedKv's rows)
MAX_STATES_BYTES = MAX_FRAME_BYTES - 4096
#: the most rows one Recheck asks for (the result's size is bounded by MAX_STATES_BYTES too)
MAX_RECHECK_ROWS = 4096
INT63 = (1 << 63) - 1
MAX_LINK_DELAY_MS = 1000
#: domain separation of a handoff's signature (the bytes still say "relay", the name these
#: messages had before: changing them would change every handoff signature)
HANDOFF_DOMAIN = b"symphony/inference-relay/v1\0"


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
    #: the stage computed, but could not send its handoff to the next hop
    NEXT_HOP_FAILED = "next_hop_failed"


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
    #: the peer whose Handoff frames feed this session ("" = only the opener's Forwards)
    upstream: str = limits(max_len=MAX_PEER_ID, default="")
    #: where a Forward with ``reply`` false sends the output ("" = nowhere: answer the opener)
    next_peer: str = limits(max_len=MAX_PEER_ID, default="")
    next_session: bytes = limits(max_len=SESSION_ID_LEN, default=b"")
    #: hold every frame this session sends (replies, handoffs) this long: an emulated link for
    #: experiments, asked by the requester for its own session only (0 = the server's own)
    link_delay_ms: int = limits(lo=0, hi=MAX_LINK_DELAY_MS, default=0)
    #: the hash of the requester's check nonce (stage_checks: the seed of the checked steps)
    check_nonce_hash: bytes = limits(max_len=DIGEST_LEN, default=b"")

    def check(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"empty block range [{self.start}, {self.end})")
        _check_link(self.next_peer, self.next_session)


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
    #: the requester's step number, carried by the handoffs it causes (and signed in them)
    step: int = limits(lo=0, hi=INT63, default=0)
    #: answer the opener with the output (True), or hand it off to the session's next hop
    reply: bool = True


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


@message(169)
@dataclass(frozen=True, slots=True, kw_only=True)
class Handoff(Message):
    """A stage's output for positions start_pos.., sent to the next stage's session."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    step: int = limits(lo=0, hi=INT63)
    start_pos: int = limits(lo=0, hi=MAX_POSITIONS)
    n: int = limits(lo=1, hi=MAX_POSITIONS)
    data: bytes = limits(max_len=MAX_HIDDEN_BYTES)
    #: the sender's Ed25519 signature of handoff_signing_bytes(...)
    signature: bytes = limits(size=SIGNATURE_LEN)


@message(170)
@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffRejected(Message):
    """The stage holding ``session_id`` got ``handoff`` from ``sender`` and refused it."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    sender: str = limits(max_len=MAX_PEER_ID)
    handoff: Handoff
    detail: str = limits(max_len=256)


@message(171)
@dataclass(frozen=True, slots=True, kw_only=True)
class Relink(Message):
    """Set a session's upstream and next hop (answered by a SessionAck)."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    upstream: str = limits(max_len=MAX_PEER_ID)
    next_peer: str = limits(max_len=MAX_PEER_ID)
    next_session: bytes = limits(max_len=SESSION_ID_LEN)

    def check(self) -> None:
        _check_link(self.next_peer, self.next_session)


@message(172)
@dataclass(frozen=True, slots=True, kw_only=True)
class StageCommit(Message):
    """A stage's commitment to one step: the digests of the input frame it computed on and of
    the output frame it produced, signed over stage_checks.commit_signing_bytes."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    step: int = limits(lo=0, hi=INT63)
    start_pos: int = limits(lo=0, hi=MAX_POSITIONS)
    n: int = limits(lo=1, hi=MAX_POSITIONS)
    input_digest: bytes = limits(size=DIGEST_LEN)
    output_digest: bytes = limits(size=DIGEST_LEN)
    #: the digest of the K/V rows the step appended (protocol.inference.recheck's layout)
    kv_digest: bytes = limits(size=DIGEST_LEN)
    signature: bytes = limits(size=SIGNATURE_LEN)


@message(173)
@dataclass(frozen=True, slots=True, kw_only=True)
class StatesAsk(Message):
    """Send the logged steps of ``session_id`` covering positions below ``end_pos``, from the
    ``first``-th on (a page at most; answered by a StatesReply; without K/V unless ``kv``)."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    end_pos: int = limits(lo=1, hi=MAX_POSITIONS)
    first: int = limits(lo=0, hi=MAX_POSITIONS)
    #: with the steps' K/V rows (False: frames only, pages of more steps)
    kv: bool = True


@message(174)
@dataclass(frozen=True, slots=True, kw_only=True)
class StatesReply(Message):
    """Logged steps [first, first + count) of ``total``: ``steps`` packs (step, start_pos, n)
    as three big-endian u64s each; ``inputs`` and ``outputs`` are their frames' data, ``kv``
    the K/V rows they appended, in order."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    first: int = limits(lo=0, hi=MAX_POSITIONS)
    total: int = limits(lo=0, hi=MAX_POSITIONS)
    steps: bytes = limits(max_len=MAX_STATES_BYTES)
    inputs: bytes = limits(max_len=MAX_STATES_BYTES)
    outputs: bytes = limits(max_len=MAX_STATES_BYTES)
    kv: bytes = limits(max_len=MAX_STATES_BYTES)


@message(175)
@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedKv(Message):
    """Append K/V rows of positions start_pos.. (a stage's committed ones, in
    protocol.inference.recheck's layout) to a session's cache, computing nothing (answered
    by a SessionAck)."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    start_pos: int = limits(lo=0, hi=MAX_POSITIONS)
    n: int = limits(lo=1, hi=MAX_POSITIONS)
    kv: bytes = limits(max_len=MAX_STATES_BYTES)


@message(176)
@dataclass(frozen=True, slots=True, kw_only=True)
class Recheck(Message):
    """Recompute the session's blocks over ``data`` (one row per position, the session's
    precision), each row at its position attending to the cached K/V up to it (answered by a
    RecheckResult)."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    positions: tuple[int, ...] = limits(max_items=MAX_RECHECK_ROWS, lo=0, hi=MAX_POSITIONS)
    data: bytes = limits(max_len=MAX_HIDDEN_BYTES)


@message(177)
@dataclass(frozen=True, slots=True, kw_only=True)
class RecheckResult(Message):
    """A Recheck's rows through the blocks: ``outputs`` (rows, hidden) and ``kv`` (rows, the
    K/V layout), little-endian fp32."""

    session_id: bytes = limits(size=SESSION_ID_LEN)
    outputs: bytes = limits(max_len=MAX_STATES_BYTES)
    kv: bytes = limits(max_len=MAX_STATES_BYTES)


#: what a requester may send on a session stream
REQUESTS = (SessionOpen, Forward, Rollback, SessionClose, Relink, StatesAsk, CommittedKv,
            Recheck)
#: what a server may answer
REPLIES = (SessionAccepted, SessionRefused, ForwardResult, SessionAck, SessionError,
           HandoffRejected, StageCommit, StatesReply, RecheckResult)


def _check_link(next_peer: str, next_session: bytes) -> None:
    if bool(next_peer) != bool(next_session) or (next_session
                                                  and len(next_session) != SESSION_ID_LEN):
        raise ValueError("a next hop needs both a peer and a 16-byte session id")


def handoff_signing_bytes(session_id: bytes, step: int, start_pos: int, n: int,
                          data: bytes) -> bytes:
    """What a Handoff's sender signs: the receiving session, the step, the positions and a
    digest of the hidden states (so the frame can be shown to the requester as evidence)."""
    return b"".join([HANDOFF_DOMAIN, session_id, step.to_bytes(8, "big"),
                     start_pos.to_bytes(8, "big"), n.to_bytes(8, "big"), digest(data)])


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
