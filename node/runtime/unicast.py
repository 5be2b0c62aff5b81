"""Unicast sends for the driver: one ordered, bounded outbox per peer and service.

What it promises (node/driver.py's contract, "Unicast"):

* One request/response protocol per network, ``protocol_id(net, MSG_PROTOCOL_NAME)``,
  carries every message: the request is the encoded message, the response an empty ack or a
  short refusal reason. The handshake types (``HANDSHAKE_TYPES``) travel on the
  network-independent ``HANDSHAKE_PROTOCOL_ID`` instead, so that two nodes of different
  networks can still tell each other why they part.
* Sends from one service to one peer leave in order, one at a time, from an outbox of
  ``OUTBOX_SIZE``; a failure, a refusal, a timeout (``SEND_TIMEOUT_S``) or a full outbox is
  handed back to the sending service as ``SendFailed`` (through the ``feed`` callback).
  Different services' outboxes to one peer do not wait for each other: a ledger pull request
  does not queue behind membership's pings and peer lists (each send is a round trip of its
  own), and no machine sees another's messages, so no order between them is lost.
* An outbox lives while its peer is connected or while it still holds messages; a peer's
  disconnect closes its outboxes (what is queued is still attempted and fails like any other
  send).
* ``drained(name, peer)`` waits until nothing service ``name`` queued for ``peer`` is still
  waiting or on its way (delivered or failed): a service that streams (the executor's
  progress frames, node/market/text_pump.py) sends its next piece only then, so its pieces
  never pile up ahead of the messages that matter (the signed result, the next bids).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from node.transport import TransportError
from protocol.codec import Message, encode
from protocol.machine import SendFailed
from protocol.membership.messages import Hello

MSG_PROTOCOL_NAME = "msg"
#: Network-independent: carries only HANDSHAKE_TYPES, so a foreign network can be told why.
HANDSHAKE_PROTOCOL_ID = "/symphony/handshake/1"
HANDSHAKE_TYPES: tuple[type[Message], ...] = (Hello,)
#: A unicast send (request + ack) fails after this long.
SEND_TIMEOUT_S = 10.0
#: Messages waiting per peer; a machine that outruns a slow peer gets SendFailed, not memory.
OUTBOX_SIZE = 256
#: An ack is empty; a refusal is a short utf-8 reason.
MAX_ACK_BYTES = 256

Feed = Callable[[str, object], Awaitable[None]]
Spawn = Callable[..., None]


class Outboxes:
    """Outboxes per (peer, service), each drained by a sender task spawned with ``spawn``."""

    def __init__(
        self,
        transport: Any,
        msg_protocol: str,
        *,
        feed: Feed,
        spawn: Spawn,
        is_connected: Callable[[str], bool],
        counters: dict[str, int],
        log: Any,
    ) -> None:
        self._transport = transport
        self._msg_protocol = msg_protocol
        self._feed = feed
        self._spawn = spawn
        self._is_connected = is_connected
        self._counters = counters
        self._log = log
        #: peer -> service name -> that service's outbox to the peer
        self._boxes: dict[str, dict[str, trio.MemorySendChannel[Message]]] = {}
        #: (peer, service) -> messages queued or on their way (absent: none)
        self._pending: dict[tuple[str, str], int] = {}
        #: (peer, service) -> set once its pending messages are all done
        self._idle: dict[tuple[str, str], trio.Event] = {}

    def enqueue(self, name: str, peer: str, message: Message) -> None:
        """Queue ``message`` from service ``name`` for ``peer``; never waits."""
        boxes = self._boxes.setdefault(peer, {})
        box = boxes.get(name)
        if box is None:
            # Bounded (see OUTBOX_SIZE): order is kept, memory per peer and service is capped.
            box, receive = trio.open_memory_channel[Message](OUTBOX_SIZE)
            boxes[name] = box
            self._spawn(self._sender, peer, name, box, receive)
        try:
            box.send_nowait(message)
        except trio.WouldBlock:
            self._spawn(self._feed, name, SendFailed(peer, message, "outbox full"))
            return
        self._pending[peer, name] = self._pending.get((peer, name), 0) + 1

    async def drained(self, name: str, peer: str) -> None:
        """Return once every message service ``name`` queued for ``peer`` so far has been
        delivered or has failed (at once when there is none)."""
        if (peer, name) in self._pending:
            await self._idle.setdefault((peer, name), trio.Event()).wait()

    def _done(self, peer: str, name: str) -> None:
        left = self._pending.pop((peer, name)) - 1
        if left:
            self._pending[peer, name] = left
            return
        idle = self._idle.pop((peer, name), None)
        if idle is not None:
            idle.set()

    def close(self, peer: str) -> None:
        """The peer disconnected: its senders end once what is queued has been attempted."""
        for box in self._boxes.pop(peer, {}).values():
            box.close()

    async def _sender(self, peer: str, name: str, box: trio.MemorySendChannel[Message],
                      receive: trio.MemoryReceiveChannel[Message]) -> None:
        async with receive:
            async for message in receive:
                try:
                    await self._deliver(peer, name, message)
                finally:
                    self._done(peer, name)
                if not self._is_connected(peer) and receive.statistics().current_buffer_used == 0:
                    self._forget(peer, name, box)
                    box.close()

    def _forget(self, peer: str, name: str, box: trio.MemorySendChannel[Message]) -> None:
        boxes = self._boxes.get(peer)
        if boxes is not None and boxes.get(name) is box:
            del boxes[name]
            if not boxes:
                del self._boxes[peer]

    async def _deliver(self, peer: str, name: str, message: Message) -> None:
        protocol = (HANDSHAKE_PROTOCOL_ID if type(message) in HANDSHAKE_TYPES
                    else self._msg_protocol)
        reason = ""
        try:
            with trio.fail_after(SEND_TIMEOUT_S):
                ack = await self._transport.request(
                    peer, protocol, encode(message), max_response_bytes=MAX_ACK_BYTES)
            if ack:
                reason = "refused: " + ack.decode("utf-8", errors="replace")
        except trio.TooSlowError:
            reason = f"no ack within {SEND_TIMEOUT_S} s"
        except TransportError as exc:
            reason = str(exc)
        if reason:
            self._counters["send_failed"] += 1
            self._log.debug("driver.send_failed", peer=peer, message=type(message).__name__,
                            reason=reason)
            await self._feed(name, SendFailed(peer, message, reason))
        else:
            self._counters["sent"] += 1
