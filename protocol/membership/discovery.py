"""Rendezvous discovery: every node keeps signed peer records of its network and serves them.

Contract
--------
* Every node is a rendezvous point for its own network id. On each new connection it sends
  the peer its own freshly signed record (``Register``) and asks it for the records it keeps
  (``DiscoverRequest``); it registers again with every connected peer each ``ttl / 2`` and asks
  one random connected peer every ``query_interval_ms``, with the cookie of that peer's last
  answer, so it keeps learning the peers that join as the network grows.
* A record that opens (protocol/membership/discovery_messages.py ``open_peer_record``) and is
  newer than the one kept for its peer replaces it and is served from then on; a peer that is
  new, or whose addresses changed, comes out as ``Discovered`` (the driver hands it to the
  membership machine as a known peer and to its peer store). Records of peers that were only
  relayed are served on too: the signature vouches for them, not the relayer.
* Bounded by named limits: ``max_records`` records in all; at most ``records_per_peer`` of
  them relayed by any one peer (its own registration aside), so one hostile peer with a
  thousand fresh keys fills ``records_per_peer`` slots, not the table; records past their
  expiry are dropped. Outgoing queries spend a budget of ``queries_per_minute``; each peer may
  send us at most ``MAX_REQUESTS_PER_MINUTE`` registrations and queries together (an honest
  node, whatever its own setting, stays under it).
* Every hostile byte costs the peer that sent it, once per message: a record that does not
  open ``RECORD_PENALTIES[why]`` (forged, foreign, expired, from the future), an answer we did
  not ask for ``PENALTY_UNSOLICITED``, a request over the rate ``PENALTY_FLOOD``. An answer to
  a query we gave up on (``QUERY_TIMEOUT_MS``, or its send reported failed) is no fault within
  ``LATE_ANSWER_MS``: a peer short of CPU answers late, and a send can fail after the message
  went out. Its records are taken like any answer's; those gave-up queries are bounded by the
  query budget.

Time: records carry Unix epoch ms; the machine's ``now`` is the driver's clock and
``clock_offset_ms`` maps it to the epoch (0 in tests and the simulator).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol.buckets import KeyedBuckets
from protocol.envelopes import seal
from protocol.late import GivenUp
from protocol.machine import (
    Effect,
    Emit,
    Event,
    PeerConnected,
    PeerDisconnected,
    Penalize,
    Received,
    Send,
    SendFailed,
    Tick,
)
from protocol.membership.discovery_messages import (
    MAX_DISCOVER_RECORDS,
    MAX_RECORD_TTL_MS,
    PEER_RECORD_DOMAIN,
    RECORD_PENALTIES,
    DiscoverRequest,
    DiscoverResponse,
    PeerRecord,
    RecordRefused,
    Register,
    open_peer_record,
)
from protocol.membership.messages import MAX_ADDRS
from protocol.names import peer_id_of_multiaddr

#: registrations and queries one peer may send us per minute (a burst of as many)
MAX_REQUESTS_PER_MINUTE = 60
#: peers whose request rate we track (the least recently seen forgotten first)
MAX_TRACKED_PEERS = 4096
#: an unanswered query is given up after this long (the peer may be asked again)
QUERY_TIMEOUT_MS = 10_000
#: an answer this long after we gave up on its query is still no fault (module doc)
LATE_ANSWER_MS = 60_000
PENALTY_UNSOLICITED = 2
PENALTY_FLOOD = 5


@dataclass(frozen=True, slots=True)
class DiscoveryConfig:
    network_id: str
    enabled: bool = True
    records_per_peer: int = 64  # records one peer may relay into our table
    record_ttl_ms: int = 600_000  # how long our own record holds; re-registered at half of it
    queries_per_minute: int = 12  # discovery queries we send, new connections' included
    max_records: int = 1024
    max_clock_skew_ms: int = 60_000  # records this far in the future or past still count

    def __post_init__(self) -> None:
        if not 1 <= self.queries_per_minute <= MAX_REQUESTS_PER_MINUTE // 2:
            raise ValueError(f"queries_per_minute must be 1..{MAX_REQUESTS_PER_MINUTE // 2} "
                             f"(peers accept {MAX_REQUESTS_PER_MINUTE} requests a minute), "
                             f"got {self.queries_per_minute}")
        if not 1_000 <= self.record_ttl_ms <= MAX_RECORD_TTL_MS:
            raise ValueError(f"record_ttl_ms must be 1000..{MAX_RECORD_TTL_MS}, "
                             f"got {self.record_ttl_ms}")
        for name in ("records_per_peer", "max_records", "max_clock_skew_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def query_interval_ms(self) -> int:
        """Periodic queries use half the budget; the rest is for new connections."""
        return 2 * 60_000 // self.queries_per_minute


# ------------------------------------------------------------------ local events and effects


@dataclass(frozen=True, slots=True)
class SetRecordAddrs:
    """The addresses our own record announces (each gets ``/p2p/<our id>`` if it lacks it)."""

    addrs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Discovered:
    """A peer of our network, new or at new addresses, learnt from ``via``'s answer or
    registration; ``issued_at_ms`` is when it signed them (Unix epoch ms)."""

    peer: str
    addrs: tuple[str, ...]
    via: str
    issued_at_ms: int


@dataclass(slots=True)
class Entry:
    envelope: Envelope
    record: PeerRecord
    source: str  # the peer that gave it to us (the record's own peer for a registration)
    seq: int  # our order of changes: what cookies count


@dataclass(slots=True)
class Discovery:
    config: DiscoveryConfig
    identity: Identity
    rng: random.Random
    clock_offset_ms: int = 0
    record_addrs: tuple[str, ...] = ()
    conns: set[str] = field(default_factory=set)
    #: peer id -> its record, in the order of ``seq`` (a change moves it to the end)
    table: OrderedDict[str, Entry] = field(default_factory=OrderedDict)
    relayed_by: dict[str, int] = field(default_factory=dict)  # source -> records it relayed
    cookies: dict[str, int] = field(default_factory=dict)  # peer -> cookie of its last answer
    pending: dict[str, int] = field(default_factory=dict)  # peer -> when we asked it
    #: queries we stopped waiting for: their late answers are no fault (module doc)
    gave_up: GivenUp = field(default_factory=lambda: GivenUp(LATE_ANSWER_MS))
    discovered: int = 0  # peers learnt from answers (not registrations), for status
    refused: int = 0  # records refused, for status
    queries: int = 0  # queries sent, for status
    _seq: int = 0
    _budget: KeyedBuckets = field(init=False)
    _intake: KeyedBuckets = field(init=False)
    _next_query_at_ms: int = 0
    _next_register_at_ms: int = 0

    def __post_init__(self) -> None:
        # cookies from before a restart are far below or above this: all records, or reset
        self._seq = self.rng.randrange(1 << 40) << 16
        qpm = self.config.queries_per_minute
        self._budget = KeyedBuckets(qpm / 60, qpm, 1)
        self._intake = KeyedBuckets(MAX_REQUESTS_PER_MINUTE / 60, MAX_REQUESTS_PER_MINUTE,
                                    MAX_TRACKED_PEERS)

    @property
    def self_peer(self) -> str:
        return self.identity.peer_id

    def next_deadline(self) -> int | None:
        if not self.config.enabled or not self.conns:
            return None
        times = [self._next_query_at_ms, self._next_register_at_ms]
        times += [at + QUERY_TIMEOUT_MS for at in self.pending.values()]
        return min(times)

    # ---------------------------------------------------------------- events

    def handle(self, event: Event, now: int) -> list[Effect]:
        out: list[Effect] = []
        if not self.config.enabled:
            return out  # off: nothing sent, and what peers send is dropped without blame
        if isinstance(event, Received):
            self._on_message(event.peer, event.message, now, out)
        elif isinstance(event, PeerConnected):
            self._on_connected(event.peer, now, out)
        elif isinstance(event, PeerDisconnected):
            self.conns.discard(event.peer)
            self.pending.pop(event.peer, None)
            self.gave_up.forget(event.peer)
            self.cookies.pop(event.peer, None)
        elif isinstance(event, SendFailed):
            if (isinstance(event.message, DiscoverRequest)
                    and self.pending.pop(event.peer, None) is not None):
                self.gave_up.add(event.peer, now)
        elif isinstance(event, SetRecordAddrs):
            self._set_record_addrs(event.addrs, now, out)
        elif not isinstance(event, Tick):
            return out
        self._on_timers(now, out)
        return out

    def _on_connected(self, peer: str, now: int, out: list[Effect]) -> None:
        if peer == self.self_peer or peer in self.conns:
            return
        self.conns.add(peer)
        if self.record_addrs:
            out.append(Send(peer, Register(record=self._own_record(now))))
        self._query(peer, now, out)

    def _on_message(self, peer: str, msg: object, now: int, out: list[Effect]) -> None:
        if peer == self.self_peer:
            return
        if isinstance(msg, DiscoverResponse):
            self._on_response(peer, msg, now, out)
            return
        if not isinstance(msg, (Register, DiscoverRequest)):
            return
        if not self._intake.take(peer, now):
            out.append(Penalize(peer, f"discovery requests over {MAX_REQUESTS_PER_MINUTE} "
                                      "a minute", PENALTY_FLOOD))
            return
        if isinstance(msg, Register):
            self._accept_all(peer, (msg.record,), now, out, registration=True)
        else:
            out.append(Send(peer, self._answer(peer, msg, now)))

    def _on_response(self, peer: str, msg: DiscoverResponse, now: int, out: list[Effect]) -> None:
        if self.pending.pop(peer, None) is None and not self.gave_up.excuses(peer, now):
            out.append(Penalize(peer, "a discovery answer we did not ask for",
                                PENALTY_UNSOLICITED))
            return
        self.cookies[peer] = msg.cookie
        self._accept_all(peer, msg.records, now, out, registration=False)

    # ---------------------------------------------------------------- records

    def _accept_all(self, source: str, envelopes: tuple[Envelope, ...], now: int,
                    out: list[Effect], *, registration: bool) -> None:
        """Keep every record of ``envelopes`` that opens; one penalty for those that do not."""
        refusals: list[RecordRefused] = []
        for envelope in envelopes:
            try:
                record = open_peer_record(
                    envelope, network_id=self.config.network_id,
                    now_epoch_ms=now + self.clock_offset_ms,
                    max_skew_ms=self.config.max_clock_skew_ms)
            except RecordRefused as exc:
                refusals.append(exc)
                continue
            if registration and record.peer_id != source:
                refusals.append(RecordRefused("forged", f"{source} registered the record of "
                                                        f"{record.peer_id}"))
                continue
            self._keep(Entry(envelope, record, source, 0), now, out, registration=registration)
        if refusals:
            self.refused += len(refusals)
            worst = max(refusals, key=lambda r: RECORD_PENALTIES[r.why])
            out.append(Penalize(source, f"{len(refusals)} peer record(s) refused, "
                                        f"e.g. {worst}", RECORD_PENALTIES[worst.why]))

    def _keep(self, entry: Entry, now: int, out: list[Effect], *, registration: bool) -> None:
        peer, source = entry.record.peer_id, entry.source
        if peer == self.self_peer:
            return  # our own record, relayed back
        old = self.table.get(peer)
        if old is not None and old.record.issued_at_ms >= entry.record.issued_at_ms:
            return  # not newer than the one we keep
        relayed = peer != source
        if relayed and (old is None or old.source != source) \
                and self.relayed_by.get(source, 0) >= self.config.records_per_peer:
            out.append(Emit("discovery_quota", {"peer": source, "record_of": peer}))
            return
        if old is None and len(self.table) >= self.config.max_records:
            self._drop_expired(now)
            if len(self.table) >= self.config.max_records:
                out.append(Emit("discovery_full", {"record_of": peer, "via": source}))
                return
        if old is not None:
            self._forget(peer)
        self._seq += 1
        entry.seq = self._seq
        self.table[peer] = entry
        if relayed:
            self.relayed_by[source] = self.relayed_by.get(source, 0) + 1
        if old is None or set(old.record.addrs) != set(entry.record.addrs):
            if old is None and not registration:
                self.discovered += 1
            out.append(Discovered(peer, entry.record.addrs, source, entry.record.issued_at_ms))
            out.append(Emit("discovered", {"peer": peer, "via": source,
                                           "addrs": list(entry.record.addrs)}))

    def _forget(self, peer: str) -> None:
        entry = self.table.pop(peer)
        if entry.source != peer:
            left = self.relayed_by[entry.source] - 1
            if left:
                self.relayed_by[entry.source] = left
            else:
                del self.relayed_by[entry.source]

    def _drop_expired(self, now: int) -> None:
        epoch = now + self.clock_offset_ms
        for peer in [p for p, e in self.table.items()
                     if e.record.expires_at_ms + self.config.max_clock_skew_ms <= epoch]:
            self._forget(peer)

    def _answer(self, asker: str, msg: DiscoverRequest, now: int) -> DiscoverResponse:
        """Live records changed after ``msg.cookie`` (all of them for a cookie we never gave)."""
        live_after = now + self.clock_offset_ms - self.config.max_clock_skew_ms
        cookie = msg.cookie if msg.cookie <= self._seq else 0
        limit = min(msg.limit, MAX_DISCOVER_RECORDS)
        records: list[Envelope] = []
        last = cookie
        for peer, entry in self.table.items():
            if entry.seq <= cookie:
                continue
            if len(records) >= limit:
                break
            last = entry.seq
            if peer != asker and entry.record.expires_at_ms > live_after:
                records.append(entry.envelope)
        else:
            last = max(last, self._seq)
        return DiscoverResponse(records=tuple(records), cookie=last)

    # ---------------------------------------------------------------- our own record, timers

    def _set_record_addrs(self, addrs: tuple[str, ...], now: int, out: list[Effect]) -> None:
        """Announce ``addrs`` from now on; peers connected already get the new record."""
        own = self._own_addrs(addrs)
        if own == self.record_addrs:
            return
        self.record_addrs = own
        if own and self.conns:
            record = self._own_record(now)
            out.extend(Send(p, Register(record=record)) for p in sorted(self.conns))

    def _own_addrs(self, addrs: tuple[str, ...]) -> tuple[str, ...]:
        me = self.self_peer
        out = []
        for addr in addrs:
            owner = peer_id_of_multiaddr(addr)
            if owner is None:
                addr = f"{addr.rstrip('/')}/p2p/{me}"
            elif owner != me:
                continue
            if addr not in out:
                out.append(addr)
        return tuple(out[:MAX_ADDRS])

    def _own_record(self, now: int) -> Envelope:
        """Our record signed afresh (so no two registrations are the same bytes)."""
        record = PeerRecord(network_id=self.config.network_id, peer_id=self.self_peer,
                            addrs=self.record_addrs, issued_at_ms=now + self.clock_offset_ms,
                            ttl_ms=self.config.record_ttl_ms)
        return seal(self.identity, PEER_RECORD_DOMAIN, record)

    def _query(self, peer: str, now: int, out: list[Effect]) -> None:
        if peer in self.pending or not self._budget.take("", now):
            return
        self.pending[peer] = now
        self.queries += 1
        out.append(Send(peer, DiscoverRequest(limit=MAX_DISCOVER_RECORDS,
                                              cookie=self.cookies.get(peer, 0))))

    def _on_timers(self, now: int, out: list[Effect]) -> None:
        for peer in [p for p, at in self.pending.items() if at + QUERY_TIMEOUT_MS <= now]:
            del self.pending[peer]
            self.gave_up.add(peer, now)
        if not self.conns:
            return
        if now >= self._next_register_at_ms:
            first = self._next_register_at_ms == 0
            self._next_register_at_ms = now + self.config.record_ttl_ms // 2
            if not first and self.record_addrs:  # at connect each peer got it already
                record = self._own_record(now)
                out.extend(Send(p, Register(record=record)) for p in sorted(self.conns))
        if now >= self._next_query_at_ms:
            self._next_query_at_ms = now + self.config.query_interval_ms
            self._drop_expired(now)
            idle = sorted(p for p in self.conns if p not in self.pending)
            if idle:
                self._query(self.rng.choice(idle), now, out)
