"""The parts of a chain as the requester holds them: what it needs from the daemon
(:class:`Directory`), a session per hop, and one inbox for everything their streams deliver.

Each hop's stream gets a reader task (spawned in the daemon's nursery) that puts every message
it decodes, or the error that ended the stream, into the chain's :class:`Inbox`, in arrival
order: with stage-to-stage forwarding the answer of a step comes from the last hop while any
hop may report a failure at any time, so the requester waits on all of them at once. A hop
marked ``closed`` is no longer heard. A hop's ``StageCommit`` frames (stage checks) are kept on
its session (``commits``, by step, at most ``MAX_COMMITS``) rather than delivered.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio

from node.inference.wire import SessionStream, unpack_hidden
from node.transport import TransportError
from protocol.codec import Message
from protocol.errors import InvalidMessage
from protocol.inference.forwarding import judge_rejection
from protocol.inference.messages import HandoffRejected, Precision, StageCommit
from protocol.inference.routing import Hop, Server

Spawn = Callable[..., Any]
#: commitments kept per hop session (a server sending more than it computed steps gains nothing)
MAX_COMMITS = 1 << 16


class ChainError(Exception):
    """The chain cannot go on: no server left for a span, or too many failures in a step."""


@dataclass
class Directory:
    """What a chain needs from the daemon: the servers on offer, streams to them, penalties."""

    servers: Callable[[], list[Server]]
    open_stream: Callable[[str], Awaitable[SessionStream]]
    report: Callable[[str, str], Awaitable[None]]
    rtt_ms: Callable[[], dict[str, float]] = dict
    #: a measured round trip to a server (a hop's time minus the compute it reported)
    observe_rtt: Callable[[str, float], None] = lambda peer, ms: None
    #: a hop failed (logged by the daemon)
    on_failure: Callable[[str, str], None] = lambda peer, detail: None
    #: starts a background task (the daemon's nursery): the readers of the hops' streams
    spawn: Spawn | None = None


class HopFailed(Exception):
    """One hop failed; ``bad_data`` when the server sent something malformed (its fault, it is
    penalized); ``also``: further peers that leave the chain with it (unpenalized)."""

    def __init__(self, peer: str, detail: str, *, bad_data: bool = False,
                 also: tuple[str, ...] = ()) -> None:
        super().__init__(f"{peer}: {detail}")
        self.peer, self.detail, self.bad_data, self.also = peer, detail, bad_data, also

    @property
    def peers(self) -> tuple[str, ...]:
        return (self.peer, *self.also)


class Stalled(HopFailed):
    """A hop (or, for a forwarded step, some hop of the chain) did not answer in time."""


@dataclass(eq=False)
class HopSession:
    hop: Hop
    stream: SessionStream
    session_id: bytes
    #: (positions, C) float32: this hop's inputs as far as the requester knows them (the first
    #: hop's always; with forwarding the others' only up to their last replay)
    inputs: np.ndarray
    upstream: str = ""
    next: tuple[str, bytes] = ("", b"")
    closed: bool = False
    #: the hop's signed commitments, by step (protocol.inference.stage_checks)
    commits: dict[int, StageCommit] = field(default_factory=dict)

    @property
    def peer(self) -> str:
        return self.hop.peer

    def keep_inputs(self, start_pos: int, sent: np.ndarray) -> None:
        """Record ``sent`` as this hop's inputs from ``start_pos`` (when the ones before are
        known: a gap would make the history wrong)."""
        if len(self.inputs) >= start_pos:
            self.inputs = np.concatenate([self.inputs[:start_pos], sent])


@dataclass
class Inbox:
    """(hop, message or the exception that ended its stream), from every hop's reader."""

    spawn: Spawn
    _send: Any = None
    _receive: Any = None

    def __post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel(math.inf)

    def watch(self, hop: HopSession) -> None:
        self.spawn(self._read, hop)

    async def _read(self, hop: HopSession) -> None:
        while not hop.closed:
            try:
                msg: Message | Exception = await hop.stream.receive()
            except (TransportError, InvalidMessage) as exc:
                msg = exc
            if hop.closed:
                return
            if isinstance(msg, StageCommit):
                if msg.session_id == hop.session_id and len(hop.commits) < MAX_COMMITS:
                    hop.commits[msg.step] = msg
                continue
            self._send.send_nowait((hop, msg))
            if isinstance(msg, Exception):
                return

    async def next(self) -> tuple[HopSession, Message | Exception]:
        """The next item of a hop still open."""
        while True:
            hop, item = await self._receive.receive()
            if not hop.closed:
                return hop, item


def judge(reporter: HopSession, rejected: HandoffRejected, step: tuple[int, int, int],
          hidden_size: int, precision: Precision) -> HopFailed:
    """The hop failure a stage's report of a bad handoff amounts to, for the forwarded step
    ``step`` (number, start position, positions): protocol.inference.forwarding judges."""
    handoff = rejected.handoff
    try:
        unpack_hidden(handoff.data, handoff.n, hidden_size, precision)
        finite = True
    except InvalidMessage:
        finite = False
    number, start_pos, n = step
    blame = judge_rejection(rejected, reporter.peer, upstream=reporter.upstream, step=number,
                            start_pos=start_pos, n=n, hidden_size=hidden_size,
                            precision=precision, finite=finite)
    return HopFailed(blame.peers[0], blame.detail, bad_data=blame.penalize, also=blame.peers[1:])
