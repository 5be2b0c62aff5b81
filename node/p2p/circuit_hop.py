"""Circuit relay v2, the relay's side (hop): reservations for unreachable peers, and circuits.

Spec: libp2p/specs relay/circuit-v2.md; wire: py-libp2p 0.8.1's generated ``circuit_pb2``
(the spec's schema), one varint-delimited message each way per exchange (node/p2p/pbwire.py).

What the relay promises: a ``RESERVE`` from a peer connected directly is answered ``OK`` with
an expiry (unix seconds), our public addresses and the circuit limits, while this node relays
(``[nat] relay_service``: "auto" relays while AutoNAT says we are public); a ``CONNECT`` to a
peer holding a live reservation opens a ``/stop`` stream to it, and once it answers ``OK`` the
two streams are spliced. Every limit is named in ``NatConfig`` and answered with the spec's
status: more than ``max_reservations`` at once -> ``RESOURCE_LIMIT_EXCEEDED``; more than
``max_circuits`` (or ``max_circuits_per_peer`` at either end) -> ``RESOURCE_LIMIT_EXCEEDED``;
no reservation -> ``NO_RESERVATION``; anything over a relayed connection ->
``PERMISSION_DENIED`` (no relay chains). A circuit ends after ``circuit_max_s`` or
``circuit_max_bytes`` in either direction, and each direction is paced to
``circuit_rate_bytes_per_s``; both streams are then reset.

What it assumes of peers: nothing. A message that is not a ``HopMessage``, oversized or
truncated raises a PeerFault (the guard penalizes it); a ``STATUS`` or unknown type is
answered ``UNEXPECTED_MESSAGE`` and penalized as "invalid"; a malformed peer id
``MALFORMED_MESSAGE``. Why not py-libp2p's own ``CircuitV2Protocol``: it retries reads of a
peer's message with sleeps, logs instead of refusing, and its limits are per reservation, not
per circuit direction; its message schema is used as it is. A peer may make
``hop_requests_per_peer_per_min`` requests a minute; past that each is refused
``RESOURCE_LIMIT_EXCEEDED`` and penalized as a flood.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import multiaddr
import structlog
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.pb.circuit_pb2 import (
    HopMessage,
    Limit,
    Reservation,
    Status,
    StopMessage,
)

from node.p2p import multiaddrs
from node.p2p.framing import PeerFault
from node.p2p.natconfig import NatConfig
from node.p2p.pbwire import read_message, write_message
from node.p2p.streams import NetBulkStream
from protocol.buckets import KeyedBuckets

HOP_ID = TProtocol("/libp2p/circuit/relay/0.2.0/hop")
STOP_ID = TProtocol("/libp2p/circuit/relay/0.2.0/stop")
#: a spliced direction reads at most this much at once
SPLICE_CHUNK = 64 << 10
#: addresses of ours a reservation answer carries at most
MAX_RESERVATION_ADDRS = 8


def is_relayed(conn: Any) -> bool:
    """Whether a libp2p connection (or a stream's muxed connection) runs through a relay."""
    try:
        return any(multiaddrs.is_relayed(a) for a in conn.get_transport_addresses())
    except Exception:
        return False


def peer_of(stream: Any) -> str:
    return str(stream.muxed_conn.peer_id.to_base58())


def circuit_limit(config: NatConfig) -> Limit:
    return Limit(duration=config.circuit_max_s, data=config.circuit_max_bytes)


class RelayService:
    """The hop protocol's handler and its bookkeeping; see the module doc."""

    def __init__(self, host: Any, config: NatConfig, read_deadline_s: float,
                 serving: Callable[[], bool], public_addrs: Callable[[], list[str]],
                 now_ms: Callable[[], int]) -> None:
        self._host = host
        per_min = config.hop_requests_per_peer_per_min
        self._budget = KeyedBuckets(per_min / 60, per_min)
        self._now_ms = now_ms
        self._config = config
        self._deadline_s = read_deadline_s
        self._serving = serving
        self._public_addrs = public_addrs
        #: peer -> when its reservation expires (unix seconds)
        self.reservations: dict[str, float] = {}
        self._circuits: Counter[str] = Counter()
        self.active_circuits = 0
        #: what happened, by outcome (status, benchmarks, tests)
        self.counts: Counter[str] = Counter()
        self._log = structlog.get_logger(__name__)

    def status(self) -> dict[str, Any]:
        self._expire()
        return {"serving": self._serving(), "reservations": len(self.reservations),
                "circuits": self.active_circuits, "counts": dict(self.counts)}

    def _expire(self) -> None:
        now = time.time()
        for peer in [p for p, until in self.reservations.items() if until <= now]:
            del self.reservations[peer]

    async def handle(self, stream: Any) -> None:
        """The hop protocol, one exchange per stream (a circuit keeps its stream)."""
        peer = peer_of(stream)
        with trio.fail_after(self._deadline_s):
            message = await read_message(stream, HopMessage)
        if is_relayed(stream.muxed_conn):
            await self._answer(stream, Status.PERMISSION_DENIED, "permission_denied")
        elif not self._budget.take(peer, self._now_ms()):
            await self._answer(stream, Status.RESOURCE_LIMIT_EXCEEDED, "over_request_rate")
            raise PeerFault("flood", "hop requests over the per-minute limit")
        elif message.type == HopMessage.RESERVE:
            await self._reserve(stream, peer)
        elif message.type == HopMessage.CONNECT:
            await self._connect(stream, peer, message)
        else:
            await self._answer(stream, Status.UNEXPECTED_MESSAGE, "unexpected")
            raise PeerFault("invalid", f"hop message of type {message.type} from a client")

    async def _answer(self, stream: Any, status: int, outcome: str,
                      **fields: Any) -> None:
        self.counts[outcome] += 1
        with trio.fail_after(self._deadline_s):
            await write_message(stream, HopMessage(type=HopMessage.STATUS, status=status,
                                                   **fields))

    async def _reserve(self, stream: Any, peer: str) -> None:
        if not self._serving():
            await self._answer(stream, Status.RESERVATION_REFUSED, "reservation_refused")
            return
        self._expire()
        if peer not in self.reservations and len(self.reservations) >= self._config.max_reservations:
            await self._answer(stream, Status.RESOURCE_LIMIT_EXCEEDED, "reservations_full")
            return
        expire = time.time() + self._config.reservation_ttl_s
        self.reservations[peer] = expire
        addrs = [multiaddr.Multiaddr(a).to_bytes()
                 for a in self._public_addrs()[:MAX_RESERVATION_ADDRS]]
        reservation = Reservation(expire=int(expire), addrs=addrs)
        self._log.info("relay.reserved", peer=peer, ttl_s=self._config.reservation_ttl_s)
        await self._answer(stream, Status.OK, "reserved", reservation=reservation,
                           limit=circuit_limit(self._config))

    def _refusal(self, source: str, target: str) -> tuple[int, str] | None:
        cfg = self._config
        self._expire()
        if target not in self.reservations:
            return Status.NO_RESERVATION, "no_reservation"
        if (self.active_circuits >= cfg.max_circuits
                or self._circuits[source] >= cfg.max_circuits_per_peer
                or self._circuits[target] >= cfg.max_circuits_per_peer):
            return Status.RESOURCE_LIMIT_EXCEEDED, "circuits_full"
        return None

    async def _connect(self, stream: Any, source: str, message: HopMessage) -> None:
        try:
            target = ID(message.peer.id).to_base58()
            ID.from_base58(target)
        except Exception:
            await self._answer(stream, Status.MALFORMED_MESSAGE, "malformed")
            raise PeerFault("invalid", "CONNECT names no valid peer id") from None
        refused = self._refusal(source, target)
        if refused is not None:
            await self._answer(stream, *refused)
            return
        self._open(source, target)
        try:
            far = await self._stop_stream(source, target)
            if far is None:
                await self._answer(stream, Status.CONNECTION_FAILED, "connection_failed")
                return
            await self._answer(stream, Status.OK, "circuit", limit=circuit_limit(self._config))
            self._log.info("relay.circuit_opened", source=source, target=target)
            try:
                await self._splice(NetBulkStream(stream, source), far)
            finally:
                with trio.CancelScope(shield=True):
                    await far.reset()
                    await NetBulkStream(stream, source).reset()
        finally:
            self._close(source, target)

    def _open(self, source: str, target: str) -> None:
        self.active_circuits += 1
        self._circuits[source] += 1
        self._circuits[target] += 1

    def _close(self, source: str, target: str) -> None:
        self.active_circuits -= 1
        for peer in (source, target):
            self._circuits[peer] -= 1
            if self._circuits[peer] <= 0:
                del self._circuits[peer]

    async def _stop_stream(self, source: str, target: str) -> NetBulkStream | None:
        """The target's ``/stop`` stream once it accepted the circuit; None if it did not."""
        try:
            with trio.fail_after(self._deadline_s):
                raw = await self._host.new_stream(ID.from_base58(target), [STOP_ID])
        except Exception as exc:
            self._log.info("relay.stop_failed", target=target, error=repr(exc)[:200])
            return None
        far = NetBulkStream(raw, target)
        request = StopMessage(type=StopMessage.CONNECT, limit=circuit_limit(self._config))
        request.peer.id = ID.from_base58(source).to_bytes()
        try:
            with trio.fail_after(self._deadline_s):
                await write_message(raw, request)
                answer = await read_message(raw, StopMessage)
        except Exception as exc:
            self._log.info("relay.stop_failed", target=target, error=repr(exc)[:200])
            await far.reset()
            return None
        if answer.type != StopMessage.STATUS or answer.status != Status.OK:
            await far.reset()
            return None
        return far

    async def _splice(self, near: NetBulkStream, far: NetBulkStream) -> None:
        """Both directions until both ended, or the circuit's time or byte limit is hit."""
        with trio.move_on_after(self._config.circuit_max_s):
            async with trio.open_nursery() as nursery:
                done = [0]

                async def pump(src: NetBulkStream, dst: NetBulkStream) -> None:
                    outcome = await self._pump(src, dst)
                    done[0] += 1
                    if outcome != "eof" or done[0] == 2:
                        self.counts[f"circuit_{outcome}"] += 1
                        nursery.cancel_scope.cancel()

                nursery.start_soon(pump, near, far)
                nursery.start_soon(pump, far, near)
                return
        self.counts["circuit_expired"] += 1

    async def _pump(self, src: NetBulkStream, dst: NetBulkStream) -> str:
        """Copy ``src`` to ``dst``, paced; how it ended: "eof", "gone" or "over_bytes"."""
        rate, cap = self._config.circuit_rate_bytes_per_s, self._config.circuit_max_bytes
        started, sent = trio.current_time(), 0
        try:
            while True:
                data = await src.read(SPLICE_CHUNK)
                if not data:
                    await dst.close()  # the half-close travels on
                    return "eof"
                sent += len(data)
                if sent > cap:
                    return "over_bytes"
                await dst.write(data)
                ahead_s = sent / rate - (trio.current_time() - started)
                if ahead_s > 0:
                    await trio.sleep(ahead_s)  # pacing to the configured rate
        except Exception:
            return "gone"
