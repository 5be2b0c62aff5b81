"""A tiny machine for engine tests: gossips Pings, answers unicast Pings with Pongs.

It uses only core messages, so the tests need no tag of their own, and keeps what it saw in
the node's store so crash/restart can be checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.machine import Emit, Publish, Received, Send, SendFailed, Tick
from protocol.membership.messages import Ping, Pong
from simulations.node import MachineSpec, VirtualNode

TOPIC = "tiny"


@dataclass(frozen=True, slots=True)
class Shout:
    nonce: int


@dataclass(frozen=True, slots=True)
class Call:
    peer: str
    nonce: int


@dataclass(frozen=True, slots=True)
class Remember:
    nonce: int


@dataclass
class TinyMachine:
    seen: set[int] = field(default_factory=set)
    pongs: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    wake_at: int | None = None
    ticks: int = 0

    def handle(self, event: object, now: int) -> list[object]:
        if isinstance(event, Shout):
            self.seen.add(event.nonce)
            return [Publish(TOPIC, Ping(nonce=event.nonce)), Remember(event.nonce)]
        if isinstance(event, Call):
            return [Send(event.peer, Ping(nonce=event.nonce))]
        if isinstance(event, Received):
            msg = event.message
            if event.topic == TOPIC and isinstance(msg, Ping):
                if msg.nonce in self.seen:
                    return [Emit("dup", {"nonce": msg.nonce})]
                self.seen.add(msg.nonce)
                return [
                    Emit("heard", {"nonce": msg.nonce, "origin": event.peer}),
                    Remember(msg.nonce),
                ]
            if isinstance(msg, Ping):
                return [Send(event.peer, Pong(nonce=msg.nonce))]
            if isinstance(msg, Pong):
                self.pongs.append(msg.nonce)
                return [Emit("pong", {"nonce": msg.nonce})]
        if isinstance(event, SendFailed):
            self.failed.append(event.reason)
            return [Emit("send_failed", {"reason": event.reason})]
        if isinstance(event, Tick):
            self.ticks += 1
            self.wake_at = None
        return []

    def next_deadline(self) -> int | None:
        return self.wake_at


def _remember(node: VirtualNode, name: str, effect: Remember) -> None:
    node.store.setdefault("seen", set()).add(effect.nonce)


def _build(node: VirtualNode) -> TinyMachine:
    return TinyMachine(seen=set(node.store.get("seen", set())))


SPEC = MachineSpec(
    name="tiny",
    build=_build,
    message_types=(Ping, Pong),
    topics=(TOPIC,),
    performers={Remember: _remember},
)
