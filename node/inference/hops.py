"""The parts of a chain as the requester holds them: what it needs from the daemon
(:class:`Directory`), a session per hop, and one inbox for everything their streams deliver.

Each hop's stream gets a reader task (spawned in the daemon's nursery) that puts every message
it decodes, or the error that ended the stream, into the chain's :class:`Inbox`, in arrival
order: with stage-to-stage forwarding the answer of a step comes from the last hop while any
hop may report a failure at any time, so the requester waits on all of them at once. A hop
marked ``closed`` is no longer heard.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import trio

from node.inference.wire import SessionStream
from node.transport import TransportError
from protocol.codec import Message
from protocol.errors import InvalidMessage
from protocol.inference.routing import Hop, Server

Spawn = Callable[..., Any]


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
            self._send.send_nowait((hop, msg))
            if isinstance(msg, Exception):
                return

    async def next(self) -> tuple[HopSession, Message | Exception]:
        """The next item of a hop still open."""
        while True:
            hop, item = await self._receive.receive()
            if not hop.closed:
                return hop, item
