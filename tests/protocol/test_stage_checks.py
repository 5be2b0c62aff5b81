"""protocol/inference/stage_checks.py and stage_log.py: commitments, the unsteerable
selection of checked steps, the tolerance, convictions and the stage's log of frames."""

from __future__ import annotations

import hashlib
import random

import pytest

from crypto.hashing import digest
from crypto.keys import Identity
from protocol.codec import MAX_FRAME_BYTES, decode, encode
from protocol.errors import InvalidMessage
from protocol.inference.messages import (
    MAX_STATES_BYTES,
    Forward,
    Precision,
    SessionOpen,
    StageCommit,
    StatesAsk,
    StatesReply,
)
from protocol.inference.session import ForwardDone, ServedBlocks, SessionLimits, SessionServer
from protocol.inference.stage_checks import (
    MAX_STAGE_ERR,
    check_nonce_hash,
    commit_hash,
    commit_ok,
    commit_signing_bytes,
    conviction,
    disagrees,
    error_detail,
    frames_problem,
    inputs_agree,
    step_checked,
)
from protocol.inference.stage_log import LoggedStep, SendCommit, StageLog, unpack_steps
from protocol.ledger.records import AttestationKind
from protocol.machine import Received, Send

SID = b"s" * 16
STAGE = Identity.from_seed(b"stage".ljust(32, b"."))


def commit(step: int = 3, data_in: bytes = b"in", data_out: bytes = b"out",
           signer: Identity = STAGE, kv: bytes = b"kv") -> StageCommit:
    i, o, k = digest(data_in), digest(data_out), digest(kv)
    return StageCommit(session_id=SID, step=step, start_pos=step, n=1, input_digest=i,
                       output_digest=o, kv_digest=k,
                       signature=signer.sign(commit_signing_bytes(SID, step, step, 1, i, o, k)))


def test_commit_signing_bytes_are_pinned_and_signatures_checked() -> None:
    signed = commit_signing_bytes(SID, 7, 3, 2, b"i" * 32, b"o" * 32, b"k" * 32)
    assert signed.startswith(b"symphony/stage-commit/v2\0" + SID + (7).to_bytes(8, "big"))
    assert signed.endswith(b"i" * 32 + b"o" * 32 + b"k" * 32)
    assert hashlib.sha256(signed).hexdigest()[:16] == "a3263b730c4d66e8"  # a change re-signs all
    good = commit()
    assert commit_ok(STAGE.peer_id, good)
    other = Identity.from_seed(b"other".ljust(32, b"."))
    assert not commit_ok(other.peer_id, good) and not commit_ok("not a peer id", good)
    assert decode(encode(good)) == good
    with pytest.raises(InvalidMessage):  # a digest is 32 bytes
        decode(encode(StageCommit(session_id=SID, step=1, start_pos=0, n=1, input_digest=b"x",
                                  output_digest=b"y" * 32, kv_digest=b"k" * 32,
                                  signature=b"z" * 64)))
    forged = StageCommit(session_id=SID, step=3, start_pos=3, n=1,  # the K/V digest is signed
                         input_digest=good.input_digest, output_digest=good.output_digest,
                         kv_digest=digest(b"other"), signature=good.signature)
    assert not commit_ok(STAGE.peer_id, forged)


def test_selection_is_a_fraction_p_fixed_by_nonce_and_commitment() -> None:
    rng = random.Random(5)
    nonce = rng.randbytes(32)
    commits = [commit(step) for step in range(2000)]
    chosen = [step_checked(nonce, STAGE.peer_id, c, 0.1) for c in commits]
    assert 150 < sum(chosen) < 250  # ~ 200 of 2000
    assert chosen == [step_checked(nonce, STAGE.peer_id, c, 0.1) for c in commits]
    other = [step_checked(rng.randbytes(32), STAGE.peer_id, c, 0.1) for c in commits]
    assert other != chosen  # another nonce, another selection
    assert not any(step_checked(nonce, STAGE.peer_id, c, 0.0) for c in commits[:50])
    assert all(step_checked(nonce, STAGE.peer_id, c, 1.0) for c in commits[:50])
    assert check_nonce_hash(nonce) != check_nonce_hash(rng.randbytes(32))
    assert len(check_nonce_hash(nonce)) == 32


def test_frames_inputs_tolerance_and_conviction() -> None:
    c = commit(data_in=b"in", data_out=b"out")
    assert frames_problem(c, b"in", b"out", b"kv") == ""
    assert "inputs" in frames_problem(c, b"IN", b"out", b"kv")
    assert "outputs" in frames_problem(c, b"in", b"OUT", b"kv")
    assert "K/V" in frames_problem(c, b"in", b"out", b"KV")
    assert "never committed" in frames_problem(None, b"in", b"out", b"kv")
    upstream = {3: commit(data_out=b"in")}
    assert inputs_agree(c, upstream) and inputs_agree(c, {})
    assert not inputs_agree(c, {3: commit(data_out=b"else")})
    assert not disagrees(0.0) and not disagrees(MAX_STAGE_ERR)
    assert disagrees(MAX_STAGE_ERR * 1.01) and disagrees(float("nan"))
    att = conviction(STAGE.peer_id, c, b"n" * 32, error_detail(0.2))
    assert att.kind is AttestationKind.VERIFICATION_FAILED and att.subject == STAGE.peer_id
    assert att.object_id == SID and len(att.evidence_hash) == 32 and "0.2" in att.outcome
    assert att.evidence_hash != conviction(STAGE.peer_id, c, b"m" * 32, "x").evidence_hash
    assert commit_hash(c) != commit_hash(commit(step=4))


def test_the_log_crops_on_rollback_and_pages_within_a_frame() -> None:
    log = StageLog()
    sent = log.add("req", SID, LoggedStep(1, 0, 4, b"a" * 8, b"A" * 8, b"k" * 16))
    assert sent == SendCommit("req", SID, 1, 0, 4, digest(b"a" * 8), digest(b"A" * 8),
                              digest(b"k" * 16))
    log.add("req", SID, LoggedStep(2, 4, 1, b"b", b"B", b"K"))
    log.add("req", SID, LoggedStep(3, 5, 3, b"c", b"C", b"L"))
    log.add("req", SID, LoggedStep(4, 6, 1, b"d", b"D", b"M"))  # rolled back into step 3
    assert [s.step for s in log.steps] == [1, 2, 3, 4]
    log.add("req", SID, LoggedStep(5, 5, 1, b"e", b"E", b"N"))  # back to 5: steps 3 and 4 go
    assert [s.step for s in log.steps] == [1, 2, 5]
    page = log.page(SID, 5, 0)
    assert page.total == 2 and unpack_steps(page.steps) == [(1, 0, 4), (2, 4, 1)]
    assert page.inputs == b"a" * 8 + b"b" and page.outputs == b"A" * 8 + b"B"
    assert page.kv == b"k" * 16 + b"K"
    assert log.page(SID, 6, 2).total == 3 and unpack_steps(log.page(SID, 6, 2).steps) == [
        (5, 5, 1)]
    log.crop(4)
    assert [s.step for s in log.steps] == [1]
    big = StageLog()
    third = MAX_STATES_BYTES // 2 - 64  # a step's inputs, outputs and K/V: half a page
    for k in range(3):
        big.add("req", SID, LoggedStep(k, k, 1, b"x" * (third // 4), b"y" * (third // 4),
                                       b"z" * (third // 2)))
    first = big.page(SID, 9, 0)
    assert len(unpack_steps(first.steps)) == 2 and len(encode(first)) <= MAX_FRAME_BYTES
    assert len(unpack_steps(big.page(SID, 9, 2).steps)) == 1
    huge = StageLog()  # a step whose K/V alone pass a frame: no page holds it
    huge.add("req", SID, LoggedStep(0, 0, 1, b"x", b"y", b"z" * MAX_STATES_BYTES))
    assert huge.page(SID, 1, 0).steps == b"" and huge.page(SID, 1, 0).total == 1
    with pytest.raises(ValueError):
        unpack_steps(b"\0" * 25)


def test_the_session_machine_commits_logs_and_answers_states_asks() -> None:
    served = ServedBlocks(model="m", start=0, end=2, hidden_size=4, cache_bytes_per_block=8)
    server = SessionServer(served, SessionLimits())
    server.handle(Received("req", SessionOpen(
        session_id=SID, model="m", start=0, end=2, max_length=16, precision=Precision.FP16,
        hidden_size=4, check_nonce_hash=b"h" * 32)), 0)
    data = b"\1" * 16
    server.handle(Received("req", Forward(session_id=SID, start_pos=0, n=2, data=data,
                                          step=9)), 1)
    done = server.handle(ForwardDone(SID, 0, 2, b"\2" * 16, 1, b"\3" * 32), 2)
    assert done[0] == SendCommit("req", SID, 9, 0, 2, digest(data), digest(b"\2" * 16),
                                 digest(b"\3" * 32))
    asked = server.handle(Received("req", StatesAsk(session_id=SID, end_pos=2, first=0)), 3)
    assert len(asked) == 1 and isinstance(asked[0], Send)
    reply = asked[0].message
    assert isinstance(reply, StatesReply) and reply.inputs == data and reply.kv == b"\3" * 32
    assert unpack_steps(reply.steps) == [(9, 0, 2)]
    stranger = server.handle(Received("x", StatesAsk(session_id=SID, end_pos=2, first=0)), 3)
    assert not isinstance(stranger[0].message, StatesReply)  # type: ignore[attr-defined]
