"""protocol.inference: stage-to-stage forwarding in the session machine, and who is blamed for
a bad handoff (protocol.inference.forwarding.judge_rejection)."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from crypto.hashing import digest
from crypto.keys import Identity
from protocol.inference.forwarding import HandoffFailed, SendHandoff, judge_rejection
from protocol.inference.messages import (
    Forward,
    ForwardResult,
    Handoff,
    HandoffRejected,
    Precision,
    Refusal,
    Relink,
    SessionAck,
    SessionError,
    SessionOpen,
    handoff_signing_bytes,
)
from protocol.inference.session import (
    ForwardDone,
    ForwardFailed,
    RunForward,
    ServedBlocks,
    SessionLimits,
    SessionServer,
)
from protocol.inference.stage_log import SendCommit
from protocol.machine import Emit, Penalize, Received, Send

C = 8
UP, ME, NEXT = (Identity.from_seed(bytes([i]) * 32) for i in (1, 2, 3))
SID, NEXT_SID = b"s" * 16, b"n" * 16


def machine() -> SessionServer:
    served = ServedBlocks(model="m", start=0, end=4, hidden_size=C, cache_bytes_per_block=10)
    server = SessionServer(served, SessionLimits())
    server.handle(Received("req", SessionOpen(
        session_id=SID, model="m", start=0, end=4, max_length=32, precision=Precision.FP16,
        hidden_size=C, upstream=UP.peer_id, next_peer=NEXT.peer_id, next_session=NEXT_SID)), 0)
    return server


def handoff(sender: Identity = UP, start: int = 0, n: int = 2, step: int = 7,
            data: bytes | None = None) -> Handoff:
    data = b"\0" * (n * C * 2) if data is None else data
    return Handoff(session_id=SID, step=step, start_pos=start, n=n, data=data,
                   signature=sender.sign(handoff_signing_bytes(SID, step, start, n, data)))


def test_handoff_signing_bytes_are_pinned() -> None:
    """The signed bytes (their domain still says "relay", the messages' former name) do not
    change with a rename: a change here changes every handoff signature on the network."""
    signed = handoff_signing_bytes(SID, 7, 3, 2, b"xy")
    assert signed == (b"symphony/inference-relay/v1\0" + SID + (7).to_bytes(8, "big")
                      + (3).to_bytes(8, "big") + (2).to_bytes(8, "big") + digest(b"xy"))
    assert hashlib.sha256(signed).hexdigest()[:16] == "ac621e102baf204b"


def test_a_handoff_from_upstream_is_computed_and_handed_on() -> None:
    server = machine()
    effects = server.handle(Received(UP.peer_id, handoff()), 1)
    assert [type(e) for e in effects] == [RunForward]
    done = server.handle(ForwardDone(SID, 0, 2, b"out", 3, b"kv"), 2)
    # committed to (the frames' and K/V's digests) before it is handed on
    assert done == [SendCommit(peer="req", session_id=SID, step=7, start_pos=0, n=2,
                               input_digest=digest(handoff().data), output_digest=digest(b"out"),
                               kv_digest=digest(b"kv")),
                    SendHandoff(peer=NEXT.peer_id, from_session=SID, session_id=NEXT_SID,
                                step=7, start_pos=0, n=2, data=b"out")]
    # a Forward that asks for the answer (a replay) answers the opener instead
    server.handle(Received("req", Forward(session_id=SID, start_pos=0, n=1, data=b"\0" * 16)), 3)
    answer = server.handle(ForwardDone(SID, 0, 1, b"o", 1, b""), 4)
    assert [type(e.message) for e in answer if isinstance(e, Send)] == [ForwardResult]
    # the handoff could not be sent: the opener hears it, the session stays
    failed = server.handle(HandoffFailed(SID, "gone"), 5)
    assert isinstance(failed[0], Send) and isinstance(failed[0].message, SessionError)
    assert failed[0].message.reason is Refusal.NEXT_HOP_FAILED and SID in server.sessions


def test_handoffs_from_others_are_ignored_and_bad_ones_reported_with_evidence() -> None:
    server = machine()
    stranger = server.handle(Received(NEXT.peer_id, handoff(NEXT)), 1)
    assert all(isinstance(e, Emit) for e in stranger)
    short = server.handle(Received(UP.peer_id, handoff(data=b"\0" * 3)), 1)
    ahead = server.handle(Received(UP.peer_id, handoff(start=5)), 1)
    for effects, why in ((short, "bytes"), (ahead, "positions")):
        assert len(effects) == 1 and isinstance(effects[0], Send), effects
        msg = effects[0].message
        assert effects[0].peer == "req" and isinstance(msg, HandoffRejected) and why in msg.detail
        assert msg.sender == UP.peer_id
    assert not any(isinstance(e, Penalize) for e in short + ahead)
    # the stream authenticates the upstream: a well-formed frame is computed whatever its
    # signature (that is evidence for the judge, who checks it: see the judge's tests)
    unsigned = server.handle(Received(UP.peer_id, handoff(NEXT)), 1)
    assert [type(e) for e in unsigned] == [RunForward]
    server.handle(ForwardDone(SID, 0, 2, b"out", 3, b""), 2)
    server.handle(Received(UP.peer_id, handoff()), 2)
    nan = server.handle(ForwardFailed(SID, True, "non-finite"), 3)
    assert isinstance(nan[0], Send) and isinstance(nan[0].message, HandoffRejected)
    assert not server.sessions[SID].busy  # the session stays for the replacement's handoff


def test_relink_moves_the_links() -> None:
    server = machine()
    acked = server.handle(Received("req", Relink(session_id=SID, upstream=NEXT.peer_id,
                                                 next_peer="", next_session=b"")), 1)
    assert [type(e.message) for e in acked if isinstance(e, Send)] == [SessionAck]
    assert all(isinstance(e, Emit) for e in server.handle(Received(UP.peer_id, handoff()), 2))
    server.handle(Received(NEXT.peer_id, handoff(NEXT)), 2)
    out = server.handle(ForwardDone(SID, 0, 2, b"o", 1, b""), 3)  # no next hop: the opener
    assert [type(e.message) for e in out if isinstance(e, Send)] == [ForwardResult]
    with pytest.raises(ValueError, match="both a peer"):
        Relink(session_id=SID, upstream="", next_peer="x", next_session=b"").check()


def judge(rejected: HandoffRejected, **kw: object) -> tuple[tuple[str, ...], bool]:
    args: dict[str, object] = dict(upstream=UP.peer_id, step=7, start_pos=0, n=2,
                                   hidden_size=C, precision=Precision.FP16, finite=True)
    args.update(kw)
    blame = judge_rejection(rejected, ME.peer_id, **args)  # type: ignore[arg-type]
    return blame.peers, blame.penalize


@pytest.mark.parametrize(("frame", "kw", "blamed", "penalized"), [
    (handoff(), {}, "reporter", True),  # a good frame of this step: the reporter lied
    (handoff(), {"finite": False}, "sender", True),  # signed NaNs
    (handoff(data=b"\0" * 5), {}, "sender", True),  # signed, wrong byte count
    (handoff(start=3), {}, "sender", True),  # this step, other positions
    (handoff(step=6, start=3), {}, "both", False),  # another step: proves nothing
    (handoff(NEXT), {}, "both", False),  # not the sender's signature
])
def test_the_judge_blames_the_stage_at_fault(frame: Handoff, kw: dict[str, object], blamed: str,
                                             penalized: bool) -> None:
    rejected = HandoffRejected(session_id=SID, sender=UP.peer_id, handoff=frame, detail="bad")
    want = {"reporter": (ME.peer_id,), "sender": (UP.peer_id,),
            "both": (UP.peer_id, ME.peer_id)}[blamed]
    assert judge(rejected, **kw) == (want, penalized)


def test_evidence_from_a_peer_not_upstream_is_the_reporters_fault() -> None:
    rejected = HandoffRejected(session_id=SID, sender=NEXT.peer_id, handoff=handoff(NEXT),
                               detail="")
    assert judge(rejected) == ((ME.peer_id,), True)
    other = dataclasses.replace(handoff(), session_id=b"o" * 16)
    assert judge(HandoffRejected(session_id=SID, sender=UP.peer_id, handoff=other,
                                 detail="")) == ((ME.peer_id,), True)
