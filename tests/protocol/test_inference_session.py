"""protocol.inference.session: the server's session machine, its limits and bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import decode, encode
from protocol.errors import InvalidMessage
from protocol.inference.messages import (
    Forward,
    ForwardResult,
    Precision,
    Refusal,
    Rollback,
    SessionAccepted,
    SessionAck,
    SessionClose,
    SessionError,
    SessionOpen,
    SessionRefused,
    max_positions_per_frame,
)
from protocol.inference.session import (
    CropCache,
    ForwardDone,
    ForwardFailed,
    FreeCache,
    RunForward,
    ServedBlocks,
    SessionLimits,
    SessionServer,
)
from protocol.machine import Penalize, Received, Send, Tick

C = 8
SERVED = ServedBlocks(model="m", start=4, end=8, hidden_size=C, cache_bytes_per_block=100)
LIMITS = SessionLimits(max_sessions=2, max_tokens_per_session=64, max_cache_bytes=60_000,
                       idle_timeout_ms=1000)


def sid(i: int) -> bytes:
    return bytes([i]) * 16


def open_msg(i: int = 1, **kw: object) -> SessionOpen:
    args: dict[str, object] = dict(session_id=sid(i), model="m", start=4, end=8, max_length=32,
                                   precision=Precision.FP16, hidden_size=C)
    args.update(kw)
    return SessionOpen(**args)  # type: ignore[arg-type]


def fwd(i: int = 1, start: int = 0, n: int = 2, nbytes: int | None = None) -> Forward:
    return Forward(session_id=sid(i), start_pos=start, n=n,
                   data=b"\0" * (n * C * 2 if nbytes is None else nbytes))


def sent(effects: list) -> list:  # type: ignore[type-arg]
    return [e.message for e in effects if isinstance(e, Send)]


def test_open_forward_rollback_close() -> None:
    m = SessionServer(SERVED, LIMITS)
    assert isinstance(sent(m.handle(Received("p", open_msg()), 0))[0], SessionAccepted)
    assert m.free_sessions == 1 and m.free_cache_bytes == 60_000 - 32 * 100 * 4
    effects = m.handle(Received("p", fwd(n=3)), 10)
    run = [e for e in effects if isinstance(e, RunForward)][0]
    assert (run.start, run.end, run.start_pos, run.n) == (4, 8, 0, 3)
    out = m.handle(ForwardDone(sid(1), 0, 3, b"x", 5, b""), 20)
    assert isinstance(sent(out)[0], ForwardResult)
    # a forward below the cached length rolls back first: no extra round trip
    effects = m.handle(Received("p", fwd(start=1, n=1)), 30)
    assert CropCache(sid(1), 1) in effects
    m.handle(ForwardDone(sid(1), 1, 1, b"x", 5, b""), 31)
    assert sent(m.handle(Received("p", Rollback(session_id=sid(1), length=1)), 32)) == [
        SessionAck(session_id=sid(1), length=1)]
    effects = m.handle(Received("p", SessionClose(session_id=sid(1))), 40)
    assert FreeCache(sid(1)) in effects and m.free_sessions == 2 and m.reserved_bytes == 0


@pytest.mark.parametrize(("msg", "reason"), [
    (open_msg(model="x"), Refusal.UNKNOWN_MODEL),
    (open_msg(start=0, end=8), Refusal.NOT_SERVED),
    (open_msg(hidden_size=C + 1), Refusal.MALFORMED),
    (open_msg(max_length=65), Refusal.TOO_LONG),
    (open_msg(max_length=60), Refusal.CACHE_FULL),  # 60 * 100 * 4 = 24 000: fits once...
])
def test_refusals_are_clear(msg: SessionOpen, reason: Refusal) -> None:
    m = SessionServer(SERVED, LIMITS)
    if reason is Refusal.CACHE_FULL:  # ...twice: 48 000; a third does not fit in 60 000
        m = SessionServer(SERVED, SessionLimits(max_sessions=8, max_tokens_per_session=64,
                                                max_cache_bytes=60_000))
        m.handle(Received("p", open_msg(2, max_length=60)), 0)
        m.handle(Received("p", open_msg(3, max_length=60)), 0)
    reply = sent(m.handle(Received("p", msg), 0))[0]
    assert isinstance(reply, SessionRefused) and reply.reason is reason and reply.detail


def test_sessions_per_server_limit_and_idle_expiry() -> None:
    m = SessionServer(SERVED, LIMITS)
    for i in (1, 2):
        m.handle(Received("p", open_msg(i)), 0)
    reply = sent(m.handle(Received("q", open_msg(3)), 0))[0]
    assert reply.reason is Refusal.SESSIONS_FULL
    assert m.next_deadline() == 1000
    m.handle(Received("p", fwd(2)), 500)
    m.handle(ForwardDone(sid(2), 0, 2, b"x", 1, b""), 600)
    assert m.handle(Tick(), 999) == []
    effects = m.handle(Tick(), 1000)
    assert FreeCache(sid(1)) in effects and FreeCache(sid(2)) not in effects
    assert sent(m.handle(Received("p", fwd(1)), 1001))[0].reason is Refusal.EXPIRED
    assert isinstance(sent(m.handle(Received("q", open_msg(3)), 1002))[0], SessionAccepted)


def test_a_stranger_cannot_use_a_session() -> None:
    m = SessionServer(SERVED, LIMITS)
    m.handle(Received("p", open_msg()), 0)
    assert sent(m.handle(Received("q", fwd()), 1))[0].reason is Refusal.UNKNOWN_SESSION
    assert m.sessions[sid(1)].length == 0


@pytest.mark.parametrize("bad", [
    fwd(nbytes=7),  # truncated hidden states
    fwd(n=3, nbytes=2 * C * 2),  # shape does not match the byte count
    fwd(start=5),  # past the cached length
    Rollback(session_id=sid(1), length=1),  # past the end
])
def test_malformed_input_ends_the_session_with_a_penalty(bad: object) -> None:
    m = SessionServer(SERVED, LIMITS)
    m.handle(Received("p", open_msg()), 0)
    effects = m.handle(Received("p", bad), 1)
    errors = [x for x in sent(effects) if isinstance(x, SessionError)]
    assert errors and errors[0].reason is Refusal.MALFORMED
    assert any(isinstance(e, Penalize) and e.peer == "p" for e in effects)
    assert FreeCache(sid(1)) in effects and not m.sessions


def test_non_finite_values_found_by_the_driver_are_penalized() -> None:
    m = SessionServer(SERVED, LIMITS)
    m.handle(Received("p", open_msg()), 0)
    m.handle(Received("p", fwd()), 1)
    effects = m.handle(ForwardFailed(sid(1), bad_input=True, detail="non-finite"), 2)
    assert any(isinstance(e, Penalize) for e in effects) and not m.sessions
    m.handle(Received("p", open_msg(2)), 3)
    m.handle(Received("p", fwd(2)), 4)
    effects = m.handle(ForwardFailed(sid(2), bad_input=False, detail="oom"), 5)
    assert not any(isinstance(e, Penalize) for e in effects)
    assert sent(effects)[0].reason is Refusal.COMPUTE_FAILED


def test_past_max_length_and_busy_requests() -> None:
    m = SessionServer(SERVED, LIMITS)
    m.handle(Received("p", open_msg(max_length=4)), 0)
    assert sent(m.handle(Received("p", fwd(n=5)), 1))[0].reason is Refusal.TOO_LONG
    m.handle(Received("p", open_msg(2)), 2)
    m.handle(Received("p", fwd(2)), 3)
    assert sent(m.handle(Received("p", fwd(2, start=0)), 4))[0].reason is Refusal.MALFORMED


def test_reused_session_id_and_stream_end() -> None:
    m = SessionServer(SERVED, LIMITS)
    m.handle(Received("p", open_msg()), 0)
    assert isinstance(m.handle(Received("p", open_msg()), 1)[0], Penalize)
    assert m.close_all("p", [sid(1)]) == [FreeCache(sid(1))] and not m.sessions


def test_messages_round_trip_and_frames_fit() -> None:
    for msg in (open_msg(), fwd(), Rollback(session_id=sid(1), length=3),
                SessionClose(session_id=sid(1))):
        assert decode(encode(msg)) == msg
    with pytest.raises(InvalidMessage):
        decode(encode(open_msg(start=8, end=8)))
    n = max_positions_per_frame(576, Precision.FP16)
    assert len(encode(fwd(n=n, nbytes=n * 576 * 2))) <= 1 << 20


# ---------------------------------------------------------------- any sequence of requests

_PEERS = ("p", "q")
_request = st.one_of(
    st.builds(lambda i, n, s, e: open_msg(i, max_length=n, start=s, end=e),
              st.integers(1, 4), st.integers(1, 80), st.integers(3, 5), st.integers(6, 9)),
    st.builds(lambda i, s, n, k: fwd(i, start=s, n=n, nbytes=None if k else n * C),
              st.integers(1, 4), st.integers(0, 70), st.integers(1, 6), st.booleans()),
    st.builds(lambda i, n: Rollback(session_id=sid(i), length=n), st.integers(1, 4),
              st.integers(0, 70)),
    st.builds(lambda i: SessionClose(session_id=sid(i)), st.integers(1, 4)),
)
_step = st.tuples(st.sampled_from(_PEERS), _request, st.integers(0, 700), st.booleans())


@settings(max_examples=60, deadline=None, derandomize=True)
@given(steps=st.lists(_step, max_size=40))
def test_limits_hold_under_any_request_sequence(steps: list[tuple[str, object, int, bool]]) -> None:
    """Whatever two requesters send, in any order: one reply per request (or a penalty for a
    reused id), never more sessions or reserved cache than the limits, caches freed once."""
    m = SessionServer(SERVED, LIMITS)
    now, freed, opened = 0, 0, 0
    for peer, msg, dt, finish in steps:
        now += dt
        effects = m.handle(Received(peer, msg), now)
        replies = [e for e in effects if isinstance(e, Send)]
        penalties = [e for e in effects if isinstance(e, Penalize)]
        runs = [e for e in effects if isinstance(e, RunForward)]
        assert all(e.peer == peer for e in replies + penalties)
        assert len(replies) + len(runs) == 1 or (penalties and not replies and not runs)
        opened += sum(isinstance(r.message, SessionAccepted) for r in replies)
        freed += sum(isinstance(e, FreeCache) for e in effects)
        for run in runs:  # the driver computes, or fails, and the machine replies
            done = (ForwardDone(run.session_id, run.start_pos, run.n, b"", 1, b"") if finish
                    else ForwardFailed(run.session_id, bad_input=False, detail="x"))
            out = m.handle(done, now)
            assert len([e for e in out if isinstance(e, Send)]) == 1
            freed += sum(isinstance(e, FreeCache) for e in out)
        freed += sum(isinstance(e, FreeCache) for e in m.handle(Tick(), now))
        assert len(m.sessions) <= LIMITS.max_sessions
        assert m.reserved_bytes <= LIMITS.max_cache_bytes
        assert all(s.length <= s.max_length for s in m.sessions.values())
    assert opened - freed == len(m.sessions)
