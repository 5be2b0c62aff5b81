"""The contract between a protocol machine and its driver.

A machine is pure logic. The driver (node/ with trio and libp2p, or simulations/ with its
virtual clock) feeds it events and performs the effects it returns:

    effects = machine.handle(event, now_ms)
    deadline = machine.next_deadline()   # call handle(Tick(), now_ms) at or after it

Time is integer milliseconds passed in; randomness is a ``random.Random`` handed to the
constructor. Messages between machines are one-way: ``Send`` delivers one message to one peer
(the node driver uses a request whose response is an empty acknowledgement; a failure comes
back as ``SendFailed``). Replies are ordinary ``Send`` effects of the receiving machine.

Events and effects common to all machines live here; a machine adds its own in its module.

A driver that hosts many machines in one process (the simulator: thousands of virtual nodes
checking the very same gossiped bytes) may share the results of the pure functions they call
on what they receive: a machine that calls such a function takes a :class:`Memo` at
construction, binds ``memo(fn)`` once and calls that wherever it would call ``fn``. The daemon
passes none and gets :func:`no_memo`, the function itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from protocol.codec import Message

# ---------------------------------------------------------------- events (driver -> machine)


@dataclass(frozen=True, slots=True)
class Tick:
    """A deadline returned by ``next_deadline`` has passed."""


@dataclass(frozen=True, slots=True)
class PeerConnected:
    peer: str
    #: the address we dialled or saw the connection from (may be empty)
    addrs: tuple[str, ...] = ()
    outbound: bool = False


@dataclass(frozen=True, slots=True)
class PeerDisconnected:
    peer: str


@dataclass(frozen=True, slots=True)
class Received:
    """A decoded message from ``peer``; ``topic`` is the short gossip topic name, if gossip."""

    peer: str
    message: Message
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class SendFailed:
    """The driver could not deliver a ``Send`` (unreachable, timeout, refused)."""

    peer: str
    message: Message
    reason: str


@dataclass(frozen=True, slots=True)
class DialFailed:
    peer: str
    reason: str


# ---------------------------------------------------------------- effects (machine -> driver)


@dataclass(frozen=True, slots=True)
class Send:
    peer: str
    message: Message


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish on the short-named gossip topic (the driver adds the network id)."""

    topic: str
    message: Message


@dataclass(frozen=True, slots=True)
class Dial:
    peer: str
    addrs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Disconnect:
    peer: str
    reason: str


@dataclass(frozen=True, slots=True)
class Penalize:
    """Count a protocol violation against ``peer``; the driver keeps the score."""

    peer: str
    reason: str
    points: int = 10


@dataclass(frozen=True, slots=True)
class Emit:
    """Something observable happened (the driver logs it; tests and the simulator count it)."""

    event: str
    fields: Mapping[str, object] = field(default_factory=dict)


#: anything a driver feeds a machine: the common events above or a machine's own local events
Event = object
#: anything a machine returns: the common effects above or a machine's own effects
Effect = object


class Machine(Protocol):
    def handle(self, event: Event, now: int) -> list[Effect]: ...

    def next_deadline(self) -> int | None: ...


#: a machine's handler of one message type: (sender, message, now) -> effects
OnMessage = Callable[[str, Any, int], list[Effect]]


def on_received(handlers: Mapping[type[Message], OnMessage], event: Received,
                now: int) -> list[Effect]:
    """What the handler ``handlers`` holds for the type of ``event``'s message returns: a
    machine's table of the messages it takes, one entry a type; a type it does not take
    yields nothing."""
    handler = handlers.get(type(event.message))
    return [] if handler is None else handler(event.peer, event.message, now)


F = TypeVar("F", bound=Callable[..., Any])


class Memo(Protocol):
    """``memo(fn)``: a function that returns what ``fn`` returns for the same arguments and
    raises what it raises, possibly a result shared with other callers. Only a function whose
    docstring says it is pure goes through a memo: its result depends on its arguments alone
    and nobody mutates it."""

    def __call__(self, fn: F, /) -> F: ...


def no_memo(fn: F, /) -> F:
    """The memo of a driver that has nothing to share: ``fn`` itself."""
    return fn
