"""The server side of inference sessions: admission, limits, cache bookkeeping, expiry.

Contract
--------
A server serves blocks [start, end) of one model. A requester opens a session on a sub-range
of them (``SessionOpen``), then sends ``Forward`` frames of hidden states, ``Rollback`` and
``SessionClose``, one request at a time per session; every request gets exactly one reply.

* Admission (``SessionOpen``): refused with a clear ``SessionRefused`` reason when the model or
  the range is not served here, the hidden size differs, ``max_length`` exceeds
  ``max_tokens_per_session``, ``max_sessions`` are open, or the session's whole cache
  (``max_length`` x bytes per position of its blocks) does not fit in what is left of
  ``max_cache_bytes``. The cache is reserved at admission, so a session can never run the
  server out of memory later: an over-limit request is refused, never attempted.
* ``Forward(start_pos, n)``: ``start_pos`` may be at most the cached length; below it, the
  cache is rolled back to ``start_pos`` first (so a speculative step after a rejection costs
  no extra round trip). ``start_pos + n`` beyond ``max_length`` ends the session (TOO_LONG).
  The driver computes (``RunForward``) and reports ``ForwardDone`` or ``ForwardFailed``.
* Malformed input (a wrong byte count, a Forward past the cached length, a request while one
  is computing, a Rollback past the end, non-finite values the driver found) ends the session
  with ``SessionError(MALFORMED)`` and a ``Penalize`` of the sender.
* A session idle for ``idle_timeout_ms`` (no request, no computation running) is dropped and
  its cache freed; a later request for it is answered ``EXPIRED``. A requester that opens
  sessions and never closes them holds at most ``max_sessions`` for ``idle_timeout_ms``.
* Only the peer that opened a session may use it; any other peer is told UNKNOWN_SESSION.

* Forwarding: a session opened with a next hop answers a ``Forward`` whose ``reply`` is
  false by handing its output off to the next hop (``SendHandoff``: the driver signs it and sends
  it on its own stream to that peer) instead of answering; a session without a next hop
  answers its opener either way. A ``Handoff`` is taken only from the session's ``upstream``
  (the requester sets it at open and by ``Relink``); one from anyone else, for no open
  session, or while the session computes is ignored (a race with a replacement). A handoff
  that fails protocol.inference.forwarding's check, or whose values the driver finds non-finite,
  is reported to the opener as ``HandoffRejected`` with the frame as evidence; the session
  stays open and no one is penalized here (the requester judges). A handoff the driver could
  not send (``HandoffFailed``) is reported as ``SessionError(NEXT_HOP_FAILED)``; the session
  stays open, its cache holds the positions, and the requester relinks it.
* Stage checks: each step is logged and committed to (stage_log); StatesAsk reads the log.
  A checker's session also takes ``CommittedKv`` and ``Recheck`` (protocol.inference.recheck).

Effects: ``Send``, ``RunForward``, ``SendHandoff``, ``SendCommit``, ``CropCache``, ``FreeCache``,
``LoadKv``, ``RunRecheck``, ``Penalize``, ``Emit``. Events: ``Received`` (a decoded request or
handoff), ``ForwardDone``, ``ForwardFailed``, ``HandoffFailed``, ``KvLoaded``,
``RecheckDone``, ``Tick``, and ``Misbehaved`` (a fault the driver saw, on either side of a
session: one penalty rule for both); the events and effects of forwards are in
protocol.inference.session_events.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from protocol.errors import InvalidMessage
from protocol.inference import recheck
from protocol.inference.forwarding import HandoffFailed, SendHandoff, handoff_problem
from protocol.inference.messages import (
    CommittedKv,
    Forward,
    ForwardResult,
    Handoff,
    HandoffRejected,
    Precision,
    Recheck,
    RecheckResult,
    Refusal,
    Relink,
    Rollback,
    SessionAccepted,
    SessionAck,
    SessionClose,
    SessionError,
    SessionOpen,
    SessionRefused,
    StatesAsk,
    check_hidden_size,
)
from protocol.inference.session_events import (
    CropCache,
    ForwardDone,
    ForwardFailed,
    FreeCache,
    Misbehaved,
    RunForward,
)
from protocol.inference.stage_log import LoggedStep, StageLog
from protocol.machine import Effect, Emit, Event, Penalize, Received, Send, Tick

#: penalty points for a malformed session request
MALFORMED_POINTS = 10
#: ids of expired or closed sessions remembered, to answer EXPIRED rather than UNKNOWN
MAX_TOMBSTONES = 1024


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_sessions: int = 16
    max_tokens_per_session: int = 4096
    max_cache_bytes: int = 1 << 30
    idle_timeout_ms: int = 60_000


@dataclass(frozen=True, slots=True)
class ServedBlocks:
    model: str
    start: int
    end: int
    hidden_size: int
    #: attention-cache bytes one position costs in one block
    cache_bytes_per_block: int


@dataclass(slots=True)
class _Session:
    peer: str
    start: int
    end: int
    max_length: int
    precision: Precision
    reserved_bytes: int
    last_active_ms: int
    length: int = 0
    busy: bool = False
    upstream: str = ""
    next_peer: str = ""
    next_session: bytes = b""
    link_delay_ms: int = 0
    #: the computation running: (its step, whether it answers the opener, the handoff it came in)
    pending: tuple[int, bool, tuple[str, Handoff] | None] = (0, True, None)
    pending_input: bytes = b""
    log: StageLog = field(default_factory=StageLog)


class SessionServer:
    """Every inference session open on this server (the machine; see the module contract)."""

    def __init__(self, served: ServedBlocks, limits: SessionLimits) -> None:
        self.served = served
        self.limits = limits
        self.sessions: dict[bytes, _Session] = {}
        self._tombstones: OrderedDict[bytes, None] = OrderedDict()

    # ------------------------------------------------------------ what the ledger advertises

    def link_delay_ms(self, session_id: bytes) -> int:
        """The emulated link delay session ``session_id`` asked for (0: none or closed)."""
        session = self.sessions.get(session_id)
        return 0 if session is None else session.link_delay_ms

    @property
    def reserved_bytes(self) -> int:
        return sum(s.reserved_bytes for s in self.sessions.values())

    @property
    def free_sessions(self) -> int:
        return max(0, self.limits.max_sessions - len(self.sessions))

    @property
    def free_cache_bytes(self) -> int:
        return max(0, self.limits.max_cache_bytes - self.reserved_bytes)

    def next_deadline(self) -> int | None:
        idle = [s.last_active_ms for s in self.sessions.values() if not s.busy]
        return min(idle) + self.limits.idle_timeout_ms if idle else None

    # ------------------------------------------------------------ events

    def handle(self, event: Event, now: int) -> list[Effect]:
        if isinstance(event, Received):
            return self._request(event.peer, event.message, now)
        if isinstance(event, ForwardDone):
            return self._done(event, now)
        if isinstance(event, ForwardFailed):
            return self._failed(event)
        if isinstance(event, recheck.KvLoaded | recheck.RecheckDone):
            return self._rechecked(event, now)
        if isinstance(event, HandoffFailed):
            session = self.sessions.get(event.session_id)
            return [] if session is None else [Send(session.peer, SessionError(
                session_id=event.session_id, reason=Refusal.NEXT_HOP_FAILED,
                detail=event.detail[:256]))]
        if isinstance(event, Tick):
            return self._expire(now)
        if isinstance(event, Misbehaved):
            return [Penalize(event.peer, f"inference: {event.detail}"[:200], MALFORMED_POINTS)]
        return []

    def _request(self, peer: str, msg: object, now: int) -> list[Effect]:
        if isinstance(msg, SessionOpen):
            return self._open(peer, msg, now)
        if isinstance(msg, Handoff):
            return self._handoff_in(peer, msg, now)
        if not isinstance(msg, Forward | Rollback | SessionClose | Relink | StatesAsk
                          | CommittedKv | Recheck):
            return [Penalize(peer, "inference: not a session request", MALFORMED_POINTS)]
        sid = msg.session_id
        session = self.sessions.get(sid)
        if session is None or session.peer != peer:
            reason = Refusal.EXPIRED if sid in self._tombstones else Refusal.UNKNOWN_SESSION
            return [Send(peer, SessionError(session_id=sid, reason=reason,
                                            detail="no such open session"))]
        if session.busy:
            return self._malformed(sid, "a request while the last one is computing")
        session.last_active_ms = now
        if isinstance(msg, StatesAsk):
            return [Send(peer, session.log.page(sid, msg.end_pos, msg.first, msg.kv))]
        if isinstance(msg, CommittedKv | Recheck):
            return self._recheck(session, sid, msg)
        if isinstance(msg, SessionClose):
            self._drop(sid)
            return [FreeCache(sid), Send(peer, SessionAck(session_id=sid, length=0)),
                    Emit("inference_session_closed", {"peer": peer})]
        if isinstance(msg, Rollback):
            if msg.length > session.length:
                return self._malformed(sid, f"rollback to {msg.length} past {session.length}")
            session.length = msg.length
            session.log.crop(msg.length)
            return [CropCache(sid, msg.length), Send(peer, SessionAck(session_id=sid,
                                                                      length=msg.length))]
        if isinstance(msg, Relink):
            session.upstream, session.next_peer = msg.upstream, msg.next_peer
            session.next_session = msg.next_session
            return [Send(peer, SessionAck(session_id=sid, length=session.length))]
        try:
            check_hidden_size(msg.data, msg.n, self.served.hidden_size, session.precision)
        except InvalidMessage as exc:
            return self._malformed(sid, str(exc))
        if msg.start_pos > session.length:
            return self._malformed(sid, f"positions from {msg.start_pos}, {session.length} held")
        return self._start(session, sid, msg.start_pos, msg.n, msg.data,
                           (msg.step, msg.reply, None))

    def _handoff_in(self, peer: str, msg: Handoff, now: int) -> list[Effect]:
        sid = msg.session_id
        session = self.sessions.get(sid)
        if session is None or not session.upstream or session.upstream != peer or session.busy:
            why = "no session" if session is None else "busy" if session.busy else "not upstream"
            return [Emit("inference_handoff_ignored", {"peer": peer, "why": why})]
        session.last_active_ms = now
        problem = handoff_problem(msg, hidden_size=self.served.hidden_size,
                                  precision=session.precision, cached=session.length)
        if problem:
            return [Send(session.peer, HandoffRejected(session_id=sid, sender=peer,
                                                       handoff=msg, detail=problem[:256]))]
        return self._start(session, sid, msg.start_pos, msg.n, msg.data,
                           (msg.step, False, (peer, msg)))

    def _open(self, peer: str, msg: SessionOpen, now: int) -> list[Effect]:
        sid, served, lim = msg.session_id, self.served, self.limits
        reason, detail = None, ""
        need = msg.max_length * served.cache_bytes_per_block * (msg.end - msg.start)
        if sid in self.sessions or sid in self._tombstones:
            return [Penalize(peer, "inference: session id reused", MALFORMED_POINTS)]
        if msg.model != served.model:
            reason, detail = Refusal.UNKNOWN_MODEL, f"this server serves {served.model!r}"
        elif not served.start <= msg.start < msg.end <= served.end:
            reason = Refusal.NOT_SERVED
            detail = f"blocks [{msg.start}, {msg.end}) outside [{served.start}, {served.end})"
        elif msg.hidden_size != served.hidden_size:
            reason, detail = Refusal.MALFORMED, f"hidden size is {served.hidden_size}"
        elif msg.max_length > lim.max_tokens_per_session:
            reason, detail = Refusal.TOO_LONG, f"at most {lim.max_tokens_per_session} tokens"
        elif len(self.sessions) >= lim.max_sessions:
            reason, detail = Refusal.SESSIONS_FULL, f"{lim.max_sessions} sessions open"
        elif need > self.free_cache_bytes:
            reason = Refusal.CACHE_FULL
            detail = f"needs {need} cache bytes, {self.free_cache_bytes} free"
        if reason is not None:
            return [Send(peer, SessionRefused(session_id=sid, reason=reason, detail=detail)),
                    Emit("inference_session_refused", {"peer": peer, "reason": reason.value})]
        self.sessions[sid] = _Session(peer=peer, start=msg.start, end=msg.end,
                                      max_length=msg.max_length, precision=msg.precision,
                                      reserved_bytes=need, last_active_ms=now,
                                      upstream=msg.upstream, next_peer=msg.next_peer,
                                      next_session=msg.next_session,
                                      link_delay_ms=msg.link_delay_ms)
        return [Send(peer, SessionAccepted(session_id=sid, max_length=msg.max_length,
                                           idle_timeout_ms=lim.idle_timeout_ms)),
                Emit("inference_session_opened", {"peer": peer, "start": msg.start,
                                                  "end": msg.end})]

    def _start(self, session: _Session, sid: bytes, start_pos: int, n: int, data: bytes,
               pending: tuple[int, bool, tuple[str, Handoff] | None]) -> list[Effect]:
        """Compute n positions from start_pos (rolled back to start_pos first)."""
        if start_pos + n > session.max_length:
            self._drop(sid)
            return [FreeCache(sid), Send(session.peer, SessionError(
                session_id=sid, reason=Refusal.TOO_LONG,
                detail=f"position {start_pos + n} past max_length {session.max_length}"))]
        effects: list[Effect] = []
        if start_pos < session.length:
            effects.append(CropCache(sid, start_pos))
            session.length = start_pos
        session.busy, session.pending, session.pending_input = True, pending, data
        effects.append(RunForward(peer=session.peer, session_id=sid, start=session.start,
                                  end=session.end, start_pos=start_pos, n=n,
                                  data=data, precision=session.precision))
        return effects

    def _done(self, event: ForwardDone, now: int) -> list[Effect]:
        session = self.sessions.get(event.session_id)
        if session is None:
            return []  # closed by its stream's end while computing
        session.busy, session.last_active_ms = False, now
        session.length = event.start_pos + event.n
        step, reply, _ = session.pending
        commit = session.log.add(session.peer, event.session_id, LoggedStep(
            step, event.start_pos, event.n, session.pending_input, event.data, event.kv))
        if not reply and session.next_peer:
            return [commit, SendHandoff(peer=session.next_peer, from_session=event.session_id,
                                        session_id=session.next_session, step=step,
                                        start_pos=event.start_pos, n=event.n, data=event.data)]
        return [commit, Send(session.peer, ForwardResult(
            session_id=event.session_id, start_pos=event.start_pos, n=event.n, data=event.data,
            compute_ms=event.compute_ms))]

    def _recheck(self, session: _Session, sid: bytes,
                 msg: CommittedKv | Recheck) -> list[Effect]:
        """Load committed K/V or recompute rows on it (protocol.inference.recheck)."""
        row = recheck.kv_row_bytes(self.served.cache_bytes_per_block, session.end - session.start)
        effect: recheck.LoadKv | recheck.RunRecheck
        if isinstance(msg, CommittedKv):
            problem = recheck.kv_problem(msg, session.length, session.max_length, row)
            effect = recheck.LoadKv(sid, session.start, session.end, msg.start_pos, msg.n,
                                    msg.kv)
        else:
            problem = recheck.recheck_problem(msg, session.length, self.served.hidden_size,
                                              session.precision, row)
            effect = recheck.RunRecheck(sid, session.start, session.end, msg.positions,
                                        msg.data, session.precision)
        if problem:
            return self._malformed(sid, problem)
        if isinstance(effect, recheck.LoadKv):
            session.length = min(session.length, effect.start_pos)
            session.log.crop(effect.start_pos)
        session.busy, session.pending = True, (0, True, None)
        return [effect]

    def _rechecked(self, event: recheck.KvLoaded | recheck.RecheckDone,
                   now: int) -> list[Effect]:
        session = self.sessions.get(event.session_id)
        if session is None:
            return []
        session.busy, session.last_active_ms = False, now
        if isinstance(event, recheck.KvLoaded):
            session.length = event.length
            return [Send(session.peer, SessionAck(session_id=event.session_id,
                                                  length=event.length))]
        return [Send(session.peer, RecheckResult(session_id=event.session_id,
                                                 outputs=event.outputs, kv=event.kv))]

    def _failed(self, event: ForwardFailed) -> list[Effect]:
        session = self.sessions.get(event.session_id)
        if session is None:
            return []
        evidence = session.pending[2]
        if event.bad_input and evidence is not None:  # the handoff's values: the opener judges
            session.busy = False
            return [Send(session.peer, HandoffRejected(session_id=event.session_id,
                                                       sender=evidence[0], handoff=evidence[1],
                                                       detail=event.detail[:256]))]
        if event.bad_input:
            return self._malformed(event.session_id, event.detail)
        self._drop(event.session_id)
        return [FreeCache(event.session_id), Send(session.peer, SessionError(
            session_id=event.session_id, reason=Refusal.COMPUTE_FAILED,
            detail=event.detail[:256]))]

    def _expire(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        for sid, s in list(self.sessions.items()):
            if not s.busy and now >= s.last_active_ms + self.limits.idle_timeout_ms:
                self._drop(sid)
                effects += [FreeCache(sid), Emit("inference_session_expired", {"peer": s.peer})]
        return effects

    def close_all(self, peer: str, session_ids: list[bytes]) -> list[Effect]:
        """The stream that carried these sessions ended: free what is still open."""
        effects: list[Effect] = []
        for sid in session_ids:
            s = self.sessions.get(sid)
            if s is not None and s.peer == peer:
                self._drop(sid)
                effects.append(FreeCache(sid))
        return effects

    def _malformed(self, sid: bytes, detail: str) -> list[Effect]:
        session = self.sessions[sid]
        self._drop(sid)
        return [FreeCache(sid),
                Send(session.peer, SessionError(session_id=sid, reason=Refusal.MALFORMED,
                                                detail=detail[:256])),
                Penalize(session.peer, f"inference: {detail}"[:200], MALFORMED_POINTS)]

    def _drop(self, sid: bytes) -> None:
        self.sessions.pop(sid, None)
        self._tombstones[sid] = None
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)
