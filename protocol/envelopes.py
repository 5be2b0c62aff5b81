"""Signed bodies: sealing a message in an envelope, and opening one that a peer sent.

Contract
--------
* ``seal(identity, domain, body)`` signs the canonical encoding of ``body`` for ``domain``.
* ``open_envelope(envelope, domain, body_type, max_frame)`` verifies the envelope for
  ``domain`` and decodes the payload bytes as received (never re-encoded first) as
  ``body_type``; anything wrong (signature, domain, size, shape) raises ``InvalidMessage``.
* ``open_authored(...)`` is how a machine opens a signed body a peer sent it: opened as above,
  and then the body's author (the field that names who speaks, e.g. a bid's bidder) must be
  both the envelope's signer and the peer that sent it. A refusal raises ``Unopened`` with
  ``why`` "invalid" (does not open) or "forged" (opens, but someone else signed or sent it);
  the caller counts it and penalizes the sender ``PENALTY_FORGED`` (``Unopened.refusal``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from crypto.envelope import Envelope, EnvelopeError
from crypto.keys import Identity
from protocol.codec import Message, decode, encode
from protocol.errors import InvalidMessage
from protocol.machine import Effect, Penalize

B = TypeVar("B", bound=Message)

#: penalty points for a signed body a peer sent that does not open, or is not its author's
#: (every machine that takes signed bodies from peers charges this one amount)
PENALTY_FORGED = 20


def seal(identity: Identity, domain: str, body: Message) -> Envelope:
    """Sign the canonical encoding of ``body`` for ``domain``."""
    return Envelope.sign(identity, domain, encode(body))


def open_envelope(envelope: Envelope, domain: str, body_type: type[B], max_frame: int) -> B:
    """Verify ``envelope`` for ``domain`` and decode its payload as ``body_type``.

    Raises InvalidMessage for a bad signature, a wrong domain, an oversized or malformed
    payload. The caller still checks that ``envelope.signer`` is who the body names.
    """
    try:
        payload = envelope.verify(domain)
    except EnvelopeError as exc:
        raise InvalidMessage(f"bad envelope: {exc}") from None
    return decode(payload, body_type, max_frame=max_frame)


class Unopened(Exception):
    """A signed body from a peer is refused: ``why`` is "invalid" or "forged"."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(f"{why}: {detail}")
        self.why = why
        self.detail = detail

    def refusal(self, peer: str, noun: str, counters: dict[str, int]) -> list[Effect]:
        """A machine's answer to this refusal of the ``noun`` (e.g. "terms") ``peer`` sent:
        counted in ``counters`` as ``<noun>_rejected.<why>``, the sender penalized."""
        key = f"{noun}_rejected.{self.why}"
        counters[key] = counters.get(key, 0) + 1
        return [Penalize(peer, f"{noun} refused: {self}", PENALTY_FORGED)]


def open_authored(
    envelope: Envelope,
    domain: str,
    body_type: type[B],
    max_frame: int,
    *,
    sender: str,
    author: Callable[[B], str],
) -> B:
    """The body in ``envelope`` if it opens (``open_envelope``) and ``author(body)`` both
    signed it and is ``sender``, the peer it came from; else ``Unopened``."""
    try:
        body = open_envelope(envelope, domain, body_type, max_frame)
    except InvalidMessage as exc:
        raise Unopened("invalid", str(exc)) from None
    named = author(body)
    if envelope.signer != named or sender != named:
        raise Unopened("forged", f"{body_type.__name__} of {named} signed or sent by another")
    return body
