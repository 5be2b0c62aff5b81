"""How the requester's machines count and refuse what peers send.

One rule for the auction (protocol/market/auction.py) and its components (bidding, result
intake) and for the verification around it (protocol/verification/): every refusal is counted
in the machine's ``counters`` as ``<noun>s_rejected.<why>``, emitted as
``<scope>.<noun>_rejected`` and, when the peer is clearly at fault, answered with a
``Penalize``. ``assigned`` finds the attempt a message claims to be about and refuses it when
it is not the sender's (a forgery).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from crypto.envelope import Envelope
from protocol.codec import Message
from protocol.envelopes import PENALTY_FORGED, Unopened, open_authored
from protocol.machine import Effect, Emit, Penalize
from protocol.market.state import Attempt, OpenTask

Reject = Callable[..., list[Effect]]
B = TypeVar("B", bound=Message)


def count(counters: dict[str, int], what: str) -> None:
    counters[what] = counters.get(what, 0) + 1


def rejecter(counters: dict[str, int], scope: str, noun: str, peer: str) -> Reject:
    """``reject(why, penalty=0)`` for one incoming ``noun`` (e.g. "bid") from ``peer``:
    counts ``<noun>s_rejected.<why>``, emits ``<scope>.<noun>_rejected`` and, with a
    penalty, penalizes the peer."""

    def reject(why: str, penalty: int = 0) -> list[Effect]:
        count(counters, f"{noun}s_rejected.{why}")
        out: list[Effect] = [Emit(f"{scope}.{noun}_rejected", {"peer": peer, "why": why})]
        if penalty:
            out.append(Penalize(peer, f"{noun} rejected: {why}", penalty))
        return out

    return reject


def opened(envelope: Envelope, domain: str, body_type: type[B], max_frame: int, peer: str,
           author: Callable[[B], str], reject: Reject) -> B | list[Effect]:
    """The body in ``envelope`` when its ``author`` signed it and is ``peer``, who sent it
    (protocol.envelopes.open_authored); else the refusal's effects (invalid or forged, each
    penalized as a forgery)."""
    try:
        return open_authored(envelope, domain, body_type, max_frame, sender=peer, author=author)
    except Unopened as refused:
        return reject(refused.why, PENALTY_FORGED)


def assigned(tasks: dict[bytes, OpenTask], peer: str, task_id: bytes, number: int,
             reject: Reject) -> tuple[OpenTask, Attempt] | list[Effect]:
    """The open task and its attempt ``number`` when that attempt was assigned to ``peer``;
    else the rejection's effects (an attempt of someone else's is a forgery)."""
    task = tasks.get(task_id)
    if task is None:
        return reject("unknown_task")
    attempt = task.attempts.get(number)
    if attempt is None or attempt.peer != peer:
        return reject("not_assigned", PENALTY_FORGED)
    return task, attempt
