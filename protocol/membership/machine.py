"""Peer membership: who is connected, what we know of them, and whom to dial next.

Contract
--------
* Every new connection starts in ``AWAITING_HELLO``; both sides send ``Hello`` at once. A peer
  whose Hello names another network id or protocol version is refused: ``Disconnect`` with a
  reason that names both values, an ``Emit("peer_refused")``, and no redial for
  ``refused_backoff_ms``. A peer that sends no Hello within ``hello_timeout_ms`` is dropped.
  Our Hello reported undelivered (``SendFailed``: a send that timed out on a loaded host) is
  sent again, at most ``MAX_HELLO_RESENDS`` times a connection: else the peer, alive and
  answering, would drop the connection at its Hello timeout.
* ``READY`` peers are pinged every ``ping_interval_ms``; the round trip is their latency. A peer
  that answers nothing for ``unresponsive_after_ms`` is dropped as unresponsive.
* Discovery: every ``exchange_interval_ms`` we ask one random ready peer for the peers it knows
  (``PeerListRequest``/``PeerList``); learnt addresses go in a bounded address book. We answer
  such requests with up to ``MAX_EXCHANGED_PEERS`` ready peers that told us their addresses.
  ``peer_exchange = False`` stops our asking (signed rendezvous records, discovery.py, remain).
* Connection target: while fewer than ``target_peers`` are connected or being dialled, we dial
  candidates from the book, bootstrap peers first, then at random. A failed dial or a lost
  peer is retried after ``peers.backoff_ms`` (exponential, jittered); bootstrap peers are
  retried forever, others are forgotten after ``MAX_FAILURES``.
  Peers the node met in an earlier run come back as ``AddKnown`` (its peer store): dialled at
  once, like peers learnt by exchange.
* Why each peer went away is kept (last ``MAX_DROPPED`` drops) for ``symphony node status``.

Assumptions of the driver: it delivers ``PeerConnected`` before any message of that
connection (a Hello that arrives first is treated as an implicit connect), and it reports the
outcome of every ``Dial`` as ``PeerConnected`` or ``DialFailed``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from protocol.machine import (
    Dial,
    DialFailed,
    Disconnect,
    Effect,
    Emit,
    Event,
    PeerConnected,
    PeerDisconnected,
    Received,
    Send,
    SendFailed,
    Tick,
)
from protocol.membership.commands import AddBootstrap, AddKnown, SetListenAddrs
from protocol.membership.messages import (
    MAX_ADDRS,
    MAX_EXCHANGED_PEERS,
    Hello,
    PeerList,
    PeerListRequest,
    Ping,
    Pong,
)
from protocol.membership.peers import (
    Connection,
    ConnState,
    Drop,
    KnownPeer,
    TimerQueue,
    backoff_ms,
    exchangeable,
)
from protocol.names import PROTOCOL_VERSION, peer_id_of_multiaddr

MAX_KNOWN_PEERS = 1024
MAX_DROPPED = 64
MAX_FAILURES = 8
#: times one connection's Hello is sent again after the driver reported it undelivered
MAX_HELLO_RESENDS = 3


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    network_id: str
    agent_version: str
    protocol_version: int = PROTOCOL_VERSION
    target_peers: int = 8  # connections we try to keep
    hello_timeout_ms: int = 5_000
    ping_interval_ms: int = 5_000
    unresponsive_after_ms: int = 20_000  # no pong for this long: drop
    exchange_interval_ms: int = 10_000  # peer exchange with one random peer
    peer_exchange: bool = True  # ask peers for theirs (answering stays on)
    backoff_base_ms: int = 500
    backoff_max_ms: int = 60_000
    refused_backoff_ms: int = 600_000  # do not redial a peer of another network for this long


@dataclass(slots=True)
class Membership:
    config: MembershipConfig
    self_peer: str
    rng: random.Random
    listen_addrs: tuple[str, ...] = ()
    conns: dict[str, Connection] = field(default_factory=dict)
    book: dict[str, KnownPeer] = field(default_factory=dict)
    dropped: deque[Drop] = field(default_factory=lambda: deque(maxlen=MAX_DROPPED))
    _closing: dict[str, str] = field(default_factory=dict)  # peer -> reason we disconnected
    _exchange_pending: set[str] = field(default_factory=set)
    _next_exchange_at_ms: int = 0
    _next_nonce: int = 1
    #: how many book entries are being dialled (kept by ``_set_dialing``: asked on every event)
    _dialing: int = 0
    #: each connection's next timer: an event costs O(log n) in the connections, not O(n)
    _timers: TimerQueue = field(default_factory=TimerQueue)
    _next_seq: int = 0

    # ---------------------------------------------------------------- queries

    def ready_peers(self) -> list[str]:
        return sorted(p for p, c in self.conns.items() if c.state is ConnState.READY)

    def is_ready(self, peer: str) -> bool:
        conn = self.conns.get(peer)
        return conn is not None and conn.state is ConnState.READY

    def next_deadline(self) -> int | None:
        times: list[int] = []
        first = self._timers.first()
        if first is not None:
            times.append(first)
        if self.config.peer_exchange and self._exchange_targets():
            times.append(self._next_exchange_at_ms)
        if self._wants_dials():
            pending = [k.next_dial_at_ms for k in self.book.values() if self._dialable(k)]
            if pending:
                times.append(min(pending))
        return min(times) if times else None

    # ---------------------------------------------------------------- events

    def handle(self, event: Event, now: int) -> list[Effect]:
        out: list[Effect] = []
        if isinstance(event, Received):
            self._on_message(event, now, out)
        elif isinstance(event, PeerConnected):
            self._on_connected(event, now, out)
        elif isinstance(event, PeerDisconnected):
            self._on_disconnected(event.peer, now, out)
        elif isinstance(event, DialFailed):
            self._on_dial_failed(event, now, out)
        elif isinstance(event, SendFailed):
            self._on_send_failed(event, out)
        elif isinstance(event, AddBootstrap):
            for addr in event.addrs:
                self._learn(addr, now, bootstrap=True)
        elif isinstance(event, AddKnown):
            for addr in event.addrs:
                self._learn(addr, now)
        elif isinstance(event, SetListenAddrs):
            self._set_listen_addrs(event.addrs[:MAX_ADDRS], out)
        elif not isinstance(event, Tick):
            return out
        self._on_timers(now, out)
        return out

    def _set_listen_addrs(self, addrs: tuple[str, ...], out: list[Effect]) -> None:
        """New addresses (a relay reservation came or went) go to every peer in a Hello."""
        changed, self.listen_addrs = addrs != self.listen_addrs, addrs
        if changed:
            out += [Send(p, self._hello()) for p in self.conns if p not in self._closing]

    def _hello(self) -> Hello:
        cfg = self.config
        return Hello(network_id=cfg.network_id, protocol_version=cfg.protocol_version,
                     agent_version=cfg.agent_version, listen_addrs=self.listen_addrs)

    def _on_connected(self, event: PeerConnected, now: int, out: list[Effect]) -> None:
        peer = event.peer
        if peer == self.self_peer or peer in self.conns:
            return
        conn = self.conns[peer] = Connection(
            peer=peer, state=ConnState.AWAITING_HELLO, connected_at_ms=now, last_seen_ms=now,
            outbound=event.outbound, seq=self._next_seq)
        self._next_seq += 1
        self._queue_timer(conn)
        known = self.book.get(peer)
        if known is not None:
            self._set_dialing(known, False)
            known.failures = 0
        out.append(Send(peer, self._hello()))

    def _on_disconnected(self, peer: str, now: int, out: list[Effect]) -> None:
        conn = self.conns.pop(peer, None)
        self._timers.discard(peer)
        self._exchange_pending.discard(peer)
        if conn is None:
            return
        reason = self._closing.pop(peer, "connection closed")
        self.dropped.append(Drop(peer, reason, now))
        out.append(Emit("peer_gone", {"peer": peer, "reason": reason}))
        known = self.book.get(peer)
        if known is not None and known.next_dial_at_ms <= now:
            known.next_dial_at_ms = now + self._backoff(known.failures)

    def _on_dial_failed(self, event: DialFailed, now: int, out: list[Effect]) -> None:
        known = self.book.get(event.peer)
        if known is None:
            return
        self._set_dialing(known, False)
        known.failures += 1
        if known.failures >= MAX_FAILURES and not known.bootstrap:
            del self.book[event.peer]
            out.append(Emit("peer_forgotten", {"peer": event.peer, "reason": event.reason}))
            return
        known.next_dial_at_ms = now + self._backoff(known.failures)

    def _on_send_failed(self, event: SendFailed, out: list[Effect]) -> None:
        """Our Hello did not reach a peer still connected: send it again (module doc)."""
        conn = self.conns.get(event.peer)
        if (not isinstance(event.message, Hello) or conn is None or event.peer in self._closing
                or conn.hello_resends >= MAX_HELLO_RESENDS):
            return
        conn.hello_resends += 1
        out.append(Send(event.peer, self._hello()))

    def _on_message(self, event: Received, now: int, out: list[Effect]) -> None:
        peer, msg = event.peer, event.message
        if peer == self.self_peer:
            return  # our own id on a message: a transport loop or a forged origin, never a peer
        if peer not in self.conns:
            self._on_connected(PeerConnected(peer), now, out)
        conn = self.conns[peer]
        conn.last_seen_ms = now
        self._on_conn_message(conn, msg, now, out)
        self._queue_timer(conn)

    def _on_conn_message(self, conn: Connection, msg: object, now: int, out: list[Effect]) -> None:
        peer = conn.peer
        if isinstance(msg, Hello):
            self._on_hello(conn, msg, now, out)
        elif conn.state is not ConnState.READY:
            return  # nothing but Hello counts before the handshake
        elif isinstance(msg, Ping):
            out.append(Send(peer, Pong(nonce=msg.nonce)))
        elif isinstance(msg, Pong):
            if conn.ping_nonce == msg.nonce:
                conn.rtt_ms = now - conn.ping_sent_at_ms
                conn.ping_nonce = None
        elif isinstance(msg, PeerListRequest):
            out.append(Send(peer, PeerList(peers=exchangeable(
                self.book, self.ready_peers(), peer, msg.max_peers))))
        elif isinstance(msg, PeerList):
            if peer in self._exchange_pending:
                self._exchange_pending.discard(peer)
                for info in msg.peers:
                    for addr in info.addrs:
                        self._learn(addr, now, expected_peer=info.peer_id)

    def _on_hello(self, conn: Connection, hello: Hello, now: int, out: list[Effect]) -> None:
        if hello.network_id != self.config.network_id:
            self._refuse(conn.peer, f"network id {hello.network_id!r} is not ours "
                         f"({self.config.network_id!r})", now, out)
            return
        if hello.protocol_version != self.config.protocol_version:
            self._refuse(conn.peer, f"protocol version {hello.protocol_version} is not ours "
                         f"({self.config.protocol_version})", now, out)
            return
        if conn.state is ConnState.READY:
            for addr in hello.listen_addrs:  # a repeated Hello: the peer's addresses changed
                self._learn(addr, now, expected_peer=conn.peer)
            return
        conn.state = ConnState.READY
        conn.agent_version = hello.agent_version
        conn.next_ping_at_ms = now  # measure latency at once
        for addr in hello.listen_addrs:
            self._learn(addr, now, expected_peer=conn.peer)
        out.append(Emit("peer_ready", {"peer": conn.peer, "agent": hello.agent_version}))

    def _refuse(self, peer: str, reason: str, now: int, out: list[Effect]) -> None:
        self._closing[peer] = reason
        known = self.book.get(peer)
        if known is not None:
            known.next_dial_at_ms = now + self.config.refused_backoff_ms
        out.append(Emit("peer_refused", {"peer": peer, "reason": reason}))
        out.append(Disconnect(peer, reason))

    # ---------------------------------------------------------------- timers

    def _conn_deadline(self, conn: Connection) -> int | None:
        """When ``conn``'s next timer is due (None: it is closing, it has none)."""
        if conn.peer in self._closing:
            return None  # gone as soon as the driver reports the disconnect
        if conn.state is ConnState.AWAITING_HELLO:
            return conn.connected_at_ms + self.config.hello_timeout_ms
        return min(conn.next_ping_at_ms, conn.last_seen_ms + self.config.unresponsive_after_ms)

    def _queue_timer(self, conn: Connection) -> None:
        """Queue ``conn``'s next timer after anything that may have moved it."""
        self._timers.set(conn.peer, conn.seq, self._conn_deadline(conn))

    def _on_timers(self, now: int, out: list[Effect]) -> None:
        cfg = self.config
        for peer in self._timers.pop_due(now):
            conn = self.conns[peer]
            self._on_conn_timer(conn, now, out)
            self._queue_timer(conn)
        if cfg.peer_exchange and now >= self._next_exchange_at_ms:
            ready = self._exchange_targets()
            if ready:
                self._next_exchange_at_ms = now + cfg.exchange_interval_ms
                target = self.rng.choice(ready)
                self._exchange_pending.add(target)
                out.append(Send(target, PeerListRequest(max_peers=MAX_EXCHANGED_PEERS)))
        self._dial_more(now, out)

    def _exchange_targets(self) -> list[str]:  # not closing: or next_deadline() could spin
        return [p for p in self.ready_peers() if p not in self._closing]

    def _on_conn_timer(self, conn: Connection, now: int, out: list[Effect]) -> None:
        cfg = self.config
        if conn.state is ConnState.AWAITING_HELLO:
            if now >= conn.connected_at_ms + cfg.hello_timeout_ms:
                self._close(conn.peer, "no hello within the timeout", out)
            return
        if now >= conn.last_seen_ms + cfg.unresponsive_after_ms:
            self._close(conn.peer, "unresponsive", out)
            return
        if now >= conn.next_ping_at_ms:
            nonce = self._next_nonce
            self._next_nonce += 1
            conn.ping_nonce, conn.ping_sent_at_ms = nonce, now
            conn.next_ping_at_ms = now + cfg.ping_interval_ms
            out.append(Send(conn.peer, Ping(nonce=nonce)))

    def _close(self, peer: str, reason: str, out: list[Effect]) -> None:
        self._closing[peer] = reason
        out.append(Disconnect(peer, reason))

    def _set_dialing(self, known: KnownPeer, dialing: bool) -> None:
        if known.dialing != dialing:
            known.dialing = dialing
            self._dialing += 1 if dialing else -1

    def _wants_dials(self) -> bool:
        return len(self.conns) + self._dialing < self.config.target_peers

    def _dialable(self, known: KnownPeer) -> bool:
        return not known.dialing and known.peer not in self.conns and bool(known.addrs)

    def _dial_more(self, now: int, out: list[Effect]) -> None:
        if not self._wants_dials():
            return
        due = [k for k in self.book.values() if self._dialable(k) and k.next_dial_at_ms <= now]
        if not due:
            return
        boot = sorted((k for k in due if k.bootstrap), key=lambda k: k.peer)
        rest = sorted((k for k in due if not k.bootstrap), key=lambda k: k.peer)
        self.rng.shuffle(rest)
        room = self.config.target_peers - len(self.conns) - self._dialing
        for known in (boot + rest)[:room]:
            self._set_dialing(known, True)
            out.append(Dial(known.peer, known.addrs))

    def _backoff(self, failures: int) -> int:
        cfg = self.config
        return backoff_ms(failures, cfg.backoff_base_ms, cfg.backoff_max_ms, self.rng)

    # ---------------------------------------------------------------- address book

    def _learn(
        self, addr: str, now: int, *, bootstrap: bool = False, expected_peer: str | None = None
    ) -> None:
        peer = peer_id_of_multiaddr(addr)
        if peer is None and expected_peer is not None:
            peer, addr = expected_peer, f"{addr.rstrip('/')}/p2p/{expected_peer}"
        if peer is None or peer == self.self_peer:
            return
        if expected_peer is not None and peer != expected_peer:
            return  # a peer may only vouch for addresses of the peer they belong to
        known = self.book.get(peer)
        if known is None:
            if len(self.book) >= MAX_KNOWN_PEERS and not bootstrap:
                return
            known = self.book[peer] = KnownPeer(peer=peer, addrs=(), next_dial_at_ms=now)
        known.bootstrap = known.bootstrap or bootstrap
        if addr not in known.addrs:
            known.addrs = (known.addrs + (addr,))[-MAX_ADDRS:]
