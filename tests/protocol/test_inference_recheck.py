"""protocol/inference/recheck.py through the session machine: a checker's session takes a
stage's committed K/V and recomputes rows on it; every malformed request ends the session and
costs its sender."""

from __future__ import annotations

import pytest

from protocol.codec import decode, encode
from protocol.inference.messages import (
    MAX_STATES_BYTES,
    CommittedKv,
    Forward,
    Precision,
    Recheck,
    RecheckResult,
    SessionAck,
    SessionError,
    SessionOpen,
)
from protocol.inference.recheck import KvLoaded, LoadKv, RecheckDone, RunRecheck, kv_row_bytes
from protocol.inference.session import ForwardDone, ServedBlocks, SessionLimits, SessionServer
from protocol.machine import Penalize, Received, Send

SID = b"c" * 16
HIDDEN = 4
#: two blocks of 8 K/V bytes a position each
ROW = kv_row_bytes(8, 2)


def _checker() -> SessionServer:
    served = ServedBlocks(model="m", start=0, end=4, hidden_size=HIDDEN, cache_bytes_per_block=8)
    server = SessionServer(served, SessionLimits())
    server.handle(Received("req", SessionOpen(
        session_id=SID, model="m", start=1, end=3, max_length=8, precision=Precision.FP16,
        hidden_size=HIDDEN)), 0)
    return server


def test_committed_kv_loads_then_rows_are_rechecked_on_it() -> None:
    server = _checker()
    kv = CommittedKv(session_id=SID, start_pos=0, n=3, kv=b"\1" * 3 * ROW)
    assert decode(encode(kv)) == kv
    assert server.handle(Received("req", kv), 1) == [LoadKv(SID, 1, 3, 0, 3, kv.kv)]
    busy = server.handle(Received("req", Recheck(session_id=SID, positions=(0,),
                                                 data=b"\0" * 8)), 2)
    assert isinstance(busy[-1], Penalize)  # one request at a time, as for a Forward
    server = _checker()
    server.handle(Received("req", kv), 1)
    assert server.handle(KvLoaded(SID, 3), 2) == [Send("req", SessionAck(session_id=SID,
                                                                         length=3))]
    ask = Recheck(session_id=SID, positions=(2, 0), data=b"\0" * 2 * HIDDEN * 2)
    assert decode(encode(ask)) == ask
    assert server.handle(Received("req", ask), 3) == [
        RunRecheck(SID, 1, 3, (2, 0), ask.data, Precision.FP16)]
    done = server.handle(RecheckDone(SID, b"o" * 32, b"k" * 2 * ROW), 4)
    assert done == [Send("req", RecheckResult(session_id=SID, outputs=b"o" * 32,
                                              kv=b"k" * 2 * ROW))]
    # committed K/V below the cached length cuts the cache back first
    again = server.handle(Received("req", CommittedKv(session_id=SID, start_pos=1, n=1,
                                                      kv=b"\2" * ROW)), 5)
    assert again == [LoadKv(SID, 1, 3, 1, 1, b"\2" * ROW)]


@pytest.mark.parametrize("request_, why", [
    (CommittedKv(session_id=SID, start_pos=0, n=2, kv=b"\1" * ROW), "bytes"),
    (CommittedKv(session_id=SID, start_pos=3, n=1, kv=b"\1" * ROW), "held"),
    (CommittedKv(session_id=SID, start_pos=2, n=7, kv=b"\1" * 7 * ROW), "max_length"),
    (Recheck(session_id=SID, positions=(), data=b""), "no rows"),
    (Recheck(session_id=SID, positions=(0,), data=b"\0" * 7), "bytes"),
    (Recheck(session_id=SID, positions=(2,), data=b"\0" * 8), "held"),
])
def test_malformed_recheck_requests_end_the_session_and_cost_the_sender(
        request_: object, why: str) -> None:
    server = _checker()
    server.handle(Received("req", CommittedKv(session_id=SID, start_pos=0, n=2,
                                              kv=b"\1" * 2 * ROW)), 1)
    server.handle(KvLoaded(SID, 2), 2)
    out = server.handle(Received("req", request_), 3)
    errors = [e.message for e in out if isinstance(e, Send)]
    assert isinstance(errors[0], SessionError) and why in errors[0].detail, errors
    assert any(isinstance(e, Penalize) and e.peer == "req" for e in out)
    assert SID not in server.sessions


def test_a_recheck_whose_result_would_not_fit_a_frame_is_refused() -> None:
    served = ServedBlocks(model="m", start=0, end=1, hidden_size=HIDDEN,
                          cache_bytes_per_block=MAX_STATES_BYTES // 2)
    server = SessionServer(served, SessionLimits(max_cache_bytes=1 << 40))
    server.handle(Received("req", SessionOpen(
        session_id=SID, model="m", start=0, end=1, max_length=4, precision=Precision.FP16,
        hidden_size=HIDDEN)), 0)
    server.handle(Received("req", Forward(session_id=SID, start_pos=0, n=2,
                                          data=b"\0" * 16)), 1)
    server.handle(ForwardDone(SID, 0, 2, b"\0" * 16, 1, b""), 2)
    out = server.handle(Received("req", Recheck(session_id=SID, positions=(0, 1),
                                                data=b"\0" * 16)), 3)
    assert any(isinstance(e, Penalize) for e in out)
    assert "fit" in [e.message for e in out if isinstance(e, Send)][0].detail  # type: ignore[attr-defined]
