"""Gossipsub as the transport runs it: our settings, subscriptions and paced publishes.

Settings changed from py-libp2p's defaults, on purpose (all are constants below):

* heartbeat every ``GOSSIP_HEARTBEAT_S`` (py-libp2p defaults to 120 s);
* spam protection raised from 10 to ``GOSSIP_MAX_MSGS_PER_TOPIC_PER_S`` messages per
  forwarding peer per topic per second, and our own publishes paced below it (beyond the cap
  py-libp2p silently stops forwarding, own messages included);
* each peer's outbound RPC queue raised from 32 to ``GOSSIP_OUTBOUND_QUEUE`` (a full queue
  silently drops);
* each subscription is drained at once from py-libp2p's 32-message channel (which drops when
  full) into our own ``GOSSIP_SUBSCRIPTION_BUFFER``-message channel, whose overflow is counted
  in :attr:`Gossip.dropped` and logged.

* frames up to ``NetLimits.gossip_max_rpc_bytes`` (larger ones are refused by the guard's
  framing, and the sending peer penalized), message payloads up to
  ``NetLimits.gossip_max_message_bytes``: publishing more is a TransportError, and a received
  message over it is dropped and its author penalized ("oversize").

A gossip message that fails py-libp2p 0.8.1's checks is dropped by ``Pubsub.push_msg``
without a word, so sending invalid ones would be free; :meth:`Gossip._guard_push` wraps that
method on our instance: a message without a signature or key is refused and its forwarder
penalized ("invalid"), and one that py-libp2p rejected (it never became "seen") is checked
again with py-libp2p's ``signature_validator``: a bad signature penalizes the forwarder too
(an honest forwarder validates before it forwards). Valid messages cost nothing extra.

Own publishes are never delivered back to our own subscriptions.

Counters: :attr:`Gossip.received_messages` and :attr:`Gossip.received_bytes` count every
message copy a peer pushes to us (its ``data`` bytes, the encoded protocol message),
duplicates included: what gossip costs this node's downlink in message bytes (gossipsub's
own framing and control messages not included), read by ``bench scale``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub import gossipsub as libp2p_gossipsub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.pubsub.validators import signature_validator

from node.p2p.guard import GuardedHost
from node.runtime.limits import NetLimits
from node.transport import TransportError

GOSSIP_PROTOCOLS = [
    libp2p_gossipsub.PROTOCOL_ID_V12,  # IDONTWANT: fewer duplicate sends
    libp2p_gossipsub.PROTOCOL_ID_V11,
    libp2p_gossipsub.PROTOCOL_ID,
]
GOSSIP_DEGREE, GOSSIP_DEGREE_LOW, GOSSIP_DEGREE_HIGH = 6, 4, 12  # the gossipsub spec's D
#: Mesh maintenance period; py-libp2p's default of 120 s leaves late joiners out for minutes.
GOSSIP_HEARTBEAT_S = 1
#: Spam cap per forwarding peer per topic per second (py-libp2p default: 10, beyond which it
#: silently stops forwarding). A forwarder relays everyone's messages on a topic, so this caps
#: the whole topic's rate; the protocol layer validates and penalizes peers on content.
GOSSIP_MAX_MSGS_PER_TOPIC_PER_S = 1000
#: Our own publishes are paced to at most this many per second (they count against the cap
#: too). py-libp2p spends CPU on every message at every hop (ARCHITECTURE.md has the figure),
#: so one process cannot sustain much more; publishing faster only grows queues and stalls
#: everything else, shutdown included. Bursts up to this size in a second go out at once.
GOSSIP_OWN_PUBLISH_PER_S = 200
#: Outbound RPCs queued per peer before py-libp2p drops (its default: 32).
GOSSIP_OUTBOUND_QUEUE = 4096
#: Messages buffered per subscription for a slow consumer; beyond it they are dropped and
#: counted (gossip is best effort; the ledger re-syncs over request/response).
GOSSIP_SUBSCRIPTION_BUFFER = 1024


class _SizedQueues(dict[Any, Any]):
    """py-libp2p's per-peer outbound RPC queues, each enlarged to GOSSIP_OUTBOUND_QUEUE.

    py-libp2p creates a queue of 32 per peer with no option to size it; this map resizes each
    queue as py-libp2p stores it, for this host only (no module-level patching).
    """

    def __setitem__(self, key: Any, queue: Any) -> None:
        queue._queue.max_size = GOSSIP_OUTBOUND_QUEUE
        super().__setitem__(key, queue)


class Gossip:
    """One host's gossipsub router and pubsub, with our subscriptions and publish pacing."""

    def __init__(self, guarded: GuardedHost, log: Any, limits: NetLimits) -> None:
        """Pubsub on ``guarded.host`` (its handlers land behind the guard as py-libp2p's);
        invalid messages py-libp2p drops are reported to the guard as faults."""
        host = guarded.host
        self._own_id = host.get_id()
        self._log = log
        self._max_message = limits.gossip_max_message_bytes
        self._fault = guarded.guard.fault
        self.router = libp2p_gossipsub.GossipSub(
            protocols=GOSSIP_PROTOCOLS,
            degree=GOSSIP_DEGREE,
            degree_low=GOSSIP_DEGREE_LOW,
            degree_high=GOSSIP_DEGREE_HIGH,
            heartbeat_interval=GOSSIP_HEARTBEAT_S,
            max_messages_per_topic_per_second=GOSSIP_MAX_MSGS_PER_TOPIC_PER_S,
        )
        self.pubsub = Pubsub(host, self.router, max_inbound_rpc_size=limits.gossip_max_rpc_bytes)
        self.pubsub.peer_queues = _SizedQueues()
        self._guard_push()
        self._subscriptions: set[str] = set()
        self._publish_times: deque[float] = deque()
        #: messages lost to a full subscription buffer, all topics together
        self.dropped = 0
        #: message copies peers pushed to us and their data bytes (see the module doc)
        self.received_messages = 0
        self.received_bytes = 0

    def _guard_push(self) -> None:
        """Penalize the forwarder of a message py-libp2p drops as invalid (see module doc)."""
        pubsub, original = self.pubsub, self.pubsub.push_msg

        async def push_msg(forwarder: ID, msg: Any) -> None:
            if forwarder == self._own_id:
                await original(forwarder, msg)
                return
            self.received_messages += 1
            self.received_bytes += len(msg.data)
            peer = forwarder.to_base58()
            if not msg.signature or not msg.key:
                self._fault(peer, "gossip", "invalid", "an unsigned gossip message")
                return
            seen_before = pubsub._is_msg_seen(msg)
            await original(forwarder, msg)
            if not seen_before and not pubsub._is_msg_seen(msg) and not signature_validator(msg):
                self._fault(peer, "gossip", "invalid", "a gossip message with a bad signature")

        pubsub.push_msg = push_msg  # type: ignore[method-assign, assignment]

    async def subscribe(
        self, topic: str, nursery: trio.Nursery
    ) -> trio.abc.ReceiveChannel[tuple[str, bytes]]:
        """``(origin, data)`` of every message on ``topic`` but our own, pumped in ``nursery``."""
        if topic in self._subscriptions:
            raise TransportError(f"already subscribed to {topic!r}")
        self._subscriptions.add(topic)
        subscription = await self.pubsub.subscribe(topic)
        # Buffered so a consumer that is briefly busy loses nothing; see the module doc.
        send, receive = trio.open_memory_channel[tuple[str, bytes]](GOSSIP_SUBSCRIPTION_BUFFER)
        nursery.start_soon(self._pump, topic, subscription, send)
        return receive

    async def _pump(self, topic: str, subscription: Any, send: trio.MemorySendChannel[Any]) -> None:
        async with send:
            while True:
                try:
                    message = await subscription.get()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    return
                origin = ID(message.from_id)
                if origin == self._own_id:
                    continue
                if len(message.data) > self._max_message:
                    self._fault(origin.to_base58(), topic, "oversize",
                                f"a {len(message.data)}-byte gossip message")
                    continue
                try:
                    send.send_nowait((origin.to_base58(), bytes(message.data)))
                except trio.WouldBlock:
                    self.dropped += 1
                    self._log.warning("transport.gossip_dropped", topic=topic,
                                      dropped=self.dropped)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # the consumer closed its end

    async def publish(self, topic: str, data: bytes) -> None:
        if len(data) > self._max_message:
            raise TransportError(f"a {len(data)}-byte gossip message exceeds the limit of "
                                 f"{self._max_message} bytes")
        now = trio.current_time()
        times = self._publish_times
        while times and times[0] <= now - 1.0:
            times.popleft()
        if len(times) >= GOSSIP_OWN_PUBLISH_PER_S:
            await trio.sleep_until(times[0] + 1.0)  # rate pacing, not a wait for a condition
        else:
            await trio.lowlevel.checkpoint()  # a publish loop must never starve the event loop
        times.append(trio.current_time())
        try:
            await self.pubsub.publish(topic, data)
        except Exception as exc:
            raise TransportError(f"publish on {topic!r} failed: {exc!r}") from exc

    async def wait_topic_peer(self, topic: str, peer_id: str) -> None:
        await self.pubsub.wait_for_mesh(ID.from_base58(peer_id), topic, timeout=math.inf)
