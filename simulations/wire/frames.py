"""Frames on the simulated wire: what crosses the network for a message, its size, opening it.

Contract
--------
* With ``wire_bytes`` every message crosses the network as its encoded frame and each
  receiver decodes its own copy; a frame that does not decode is counted as
  ``invalid_frames`` and costs its sender ``INVALID_MESSAGE_PENALTY`` with the receiver, and
  nothing is delivered. Without it the message object itself travels (every receiver gets
  the same immutable object).
* A frame's size is ``len(encode(message)) + FRAME_OVERHEAD`` in both modes, so traffic
  figures do not depend on the fidelity chosen.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.codec import Message, decode
from protocol.errors import InvalidMessage
from simulations.metrics import Metrics
from simulations.node import INVALID_MESSAGE_PENALTY, VirtualNode

#: per-message framing overhead on a stream (length prefix + yamux header)
FRAME_OVERHEAD = 16


class Frames:
    """Framing and opening of messages for one swarm (``wire_bytes`` or objects); ``encode`` is
    ``protocol.codec.encode`` as the swarm's memo shares it (simulations/memo.py)."""

    __slots__ = ("wire_bytes", "metrics", "encode")

    def __init__(
        self, wire_bytes: bool, metrics: Metrics, encode: Callable[[Message], bytes]
    ) -> None:
        self.wire_bytes = wire_bytes
        self.metrics = metrics
        self.encode = encode

    def frame(self, message: Message) -> tuple[object, int]:
        """What crosses the wire for ``message`` and its size in bytes."""
        data = self.encode(message)
        if self.wire_bytes:
            return data, len(data) + FRAME_OVERHEAD
        return message, len(data) + FRAME_OVERHEAD

    def open(self, dst: VirtualNode, src: VirtualNode, payload: object) -> Message | None:
        """The message ``dst`` got from ``src``; None (and ``src`` penalized) if garbage."""
        if not self.wire_bytes:
            return payload  # type: ignore[return-value]
        try:
            return decode(payload)  # type: ignore[arg-type]
        except InvalidMessage as exc:
            self.metrics.count("invalid_frames")
            dst.penalize(src.peer_id, f"invalid message: {exc}", INVALID_MESSAGE_PENALTY)
            return None

    def decodes(self, payload: object) -> bool:
        """Whether ``payload`` (encoded bytes) is a valid frame."""
        try:
            decode(payload)  # type: ignore[arg-type]
        except InvalidMessage:
            return False
        return True
