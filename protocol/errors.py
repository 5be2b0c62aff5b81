"""Errors say whose fault it was.

* ``InvalidMessage``: bytes from the wire are not a valid message (any decoding failure).
* ``RemoteProtocolError``: a peer sent something that breaks the protocol; it names the peer
  and carries a penalty hint. Only the driver catches it: it penalizes or disconnects the peer
  and keeps running.
* ``LocalProtocolError``: our own code misused a machine (a bug here, not a peer's fault).
"""

from __future__ import annotations


class InvalidMessage(ValueError):
    """The one error for any malformed, oversized, mistyped or unknown message."""


class LocalProtocolError(RuntimeError):
    """This node misused a protocol machine."""


class RemoteProtocolError(Exception):
    """A peer violated the protocol."""

    def __init__(self, peer: str, reason: str, *, penalty: int = 10) -> None:
        super().__init__(f"{peer}: {reason}")
        self.peer = peer
        self.reason = reason
        self.penalty = penalty
