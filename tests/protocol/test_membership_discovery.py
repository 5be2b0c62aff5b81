"""Rendezvous discovery, driven directly: signed records found through any peer, kept within
named limits, and every hostile byte refused and charged to the peer that sent it."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crypto.envelope import Envelope
from crypto.keys import Identity
from protocol.codec import Message, decode, encode
from protocol.envelopes import seal
from protocol.machine import (
    Emit,
    PeerConnected,
    PeerDisconnected,
    Penalize,
    Received,
    Send,
    SendFailed,
    Tick,
)
from protocol.membership.discovery import (
    LATE_ANSWER_MS,
    MAX_REQUESTS_PER_MINUTE,
    PENALTY_FLOOD,
    PENALTY_UNSOLICITED,
    QUERY_TIMEOUT_MS,
    Discovered,
    Discovery,
    DiscoveryConfig,
    SetRecordAddrs,
)
from protocol.membership.discovery_messages import (
    MAX_DISCOVER_RECORDS,
    MAX_RECORD_BYTES,
    PEER_RECORD_DOMAIN,
    RECORD_PENALTIES,
    DiscoverRequest,
    DiscoverResponse,
    PeerRecord,
    RecordRefused,
    Register,
    open_peer_record,
)
from tests.protocol.fuzzing import SIGNERS, messages_of, mutate

NET = "testnet"
T0 = 1_700_000_000_000  # the machines' clock offset: records carry epoch ms near this


def ident(n: int) -> Identity:
    return Identity.from_seed(bytes([n]) * 32)


def addr(peer: str, port: int = 4001) -> str:
    return f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}"


def machine(n: int, **overrides: object) -> Discovery:
    cfg = DiscoveryConfig(network_id=NET, **overrides)  # type: ignore[arg-type]
    m = Discovery(config=cfg, identity=ident(n), rng=random.Random(n), clock_offset_ms=T0)
    m.handle(SetRecordAddrs((f"/ip4/127.0.0.1/tcp/{4000 + n}",)), 0)
    return m


def record(who: Identity, *, network: str = NET, issued: int = T0, ttl: int = 600_000,
           addrs: tuple[str, ...] | None = None, signer: Identity | None = None) -> Envelope:
    body = PeerRecord(network_id=network, peer_id=who.peer_id,
                      addrs=addrs if addrs is not None else (addr(who.peer_id),),
                      issued_at_ms=issued, ttl_ms=ttl)
    return seal(signer or who, PEER_RECORD_DOMAIN, body)


def of(effects: list[object], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


class Wire:
    """Machines connected pairwise; ``run`` delivers every Send (through the codec) until
    none is left, and keeps what each machine discovered."""

    def __init__(self, *machines: Discovery) -> None:
        self.m = {m.self_peer: m for m in machines}
        self.found: dict[str, set[str]] = {p: set() for p in self.m}
        self.penalties: list[Penalize] = []

    def connect(self, a: Discovery, b: Discovery, now: int = 0) -> None:
        self.run([(a.self_peer, e) for e in a.handle(PeerConnected(b.self_peer), now)]
                 + [(b.self_peer, e) for e in b.handle(PeerConnected(a.self_peer), now)], now)

    def tick(self, now: int) -> None:
        self.run([(p, e) for p, m in self.m.items() for e in m.handle(Tick(), now)], now)

    def run(self, effects: list[tuple[str, object]], now: int) -> None:
        while effects:
            sender, effect = effects.pop(0)
            if isinstance(effect, Discovered):
                self.found[sender].add(effect.peer)
            elif isinstance(effect, Penalize):
                self.penalties.append(effect)
            elif isinstance(effect, Send):
                to = self.m[effect.peer]
                msg = decode(encode(effect.message))
                effects += [(to.self_peer, e) for e in to.handle(Received(sender, msg), now)]


def test_peers_that_know_only_one_node_find_each_other_through_it() -> None:
    a, b, c = machine(1), machine(2), machine(3)
    wire = Wire(a, b, c)
    wire.connect(c, b)
    wire.connect(a, b)
    # A asked B at connect and got C's signed record; C learns A at its next query of B
    assert a.self_peer not in wire.found[a.self_peer]
    assert c.self_peer in wire.found[a.self_peer]
    assert b.table[a.self_peer].source == a.self_peer  # B keeps A's own registration
    wire.tick(c.config.query_interval_ms)
    assert a.self_peer in wire.found[c.self_peer]
    assert wire.penalties == []
    # the record A was given carries C's own dialable address
    assert a.table[c.self_peer].record.addrs == (f"/ip4/127.0.0.1/tcp/4003/p2p/{c.self_peer}",)


def test_nodes_keep_finding_peers_as_the_network_grows_beyond_one_hop() -> None:
    a, b, c, d = machine(1), machine(2), machine(3), machine(4)
    wire = Wire(a, b, c, d)
    wire.connect(a, b)
    wire.connect(b, c)
    wire.connect(c, d)  # D joins later, two hops from A, connected to C only
    assert d.self_peer not in wire.found[a.self_peer]
    for i in range(1, 4):
        wire.tick(i * a.config.query_interval_ms)
    # B learnt D's record from C (relayed, signed by D) and A learnt it from B
    assert d.self_peer in wire.found[a.self_peer]
    assert a.table[d.self_peer].source == b.self_peer
    assert a.self_peer in wire.found[d.self_peer]
    assert wire.penalties == []


def test_an_answer_carries_only_what_changed_since_the_askers_cookie() -> None:
    a, b = machine(1), machine(2)
    b.handle(Received(ident(5).peer_id, Register(record=record(ident(5)))), 0)
    first = b.handle(Received(a.self_peer, DiscoverRequest(limit=32, cookie=0)), 0)
    (answer,) = [e.message for e in of(first, Send)]
    assert len(answer.records) == 1
    again = b.handle(Received(a.self_peer, DiscoverRequest(limit=32, cookie=answer.cookie)), 1)
    assert of(again, Send)[0].message.records == ()
    # a newer record of peer 5 is a change; a cookie from before a restart gets everything
    b.handle(Received(ident(5).peer_id, Register(record=record(ident(5), issued=T0 + 5))), 2)
    later = b.handle(Received(a.self_peer, DiscoverRequest(limit=32, cookie=answer.cookie)), 3)
    assert len(of(later, Send)[0].message.records) == 1
    stale = b.handle(Received(a.self_peer, DiscoverRequest(limit=32, cookie=(1 << 63) - 1)), 4)
    assert len(of(stale, Send)[0].message.records) == 1


def test_answers_page_through_many_records_and_skip_the_askers_own() -> None:
    b = machine(2)
    peers = [ident(10 + i) for i in range(MAX_DISCOVER_RECORDS + 5)]
    for p in peers:
        b.handle(Received(p.peer_id, Register(record=record(p))), 0)
    asker, cookie, got = peers[0].peer_id, 0, []
    for now in range(3):
        (answer,) = [e.message for e in of(
            b.handle(Received(asker, DiscoverRequest(limit=MAX_DISCOVER_RECORDS,
                                                     cookie=cookie)), now), Send)]
        got += [env.signer for env in answer.records]
        cookie = answer.cookie
    assert sorted(got) == sorted(p.peer_id for p in peers[1:])


@pytest.mark.parametrize(("bad", "why"), [
    (lambda: record(ident(5), signer=ident(6)), "forged"),
    (lambda: record(ident(5), network="othernet"), "foreign"),
    (lambda: record(ident(5), issued=T0 - 700_000, ttl=1_000), "expired"),
    (lambda: record(ident(5), issued=T0 + 3_600_000), "future"),
    (lambda: record(ident(5), addrs=(addr(ident(6).peer_id),)), "invalid"),
    (lambda: Envelope.sign(ident(5), "symphony/other/v1", b"\x90"), "invalid"),
    (lambda: Envelope.sign(ident(5), PEER_RECORD_DOMAIN, b"\x00" * (MAX_RECORD_BYTES + 1)),
     "invalid"),
])
def test_a_bad_record_in_an_answer_is_refused_and_charged_once(bad, why) -> None:
    a, b = machine(1), machine(2)
    a.handle(PeerConnected(b.self_peer), 0)
    good = record(ident(7))
    out = a.handle(Received(b.self_peer, DiscoverResponse(records=(bad(), bad(), good),
                                                          cookie=1)), 0)
    (penalty,) = of(out, Penalize)
    assert penalty.peer == b.self_peer and penalty.points == RECORD_PENALTIES[why]
    assert f"2 peer record(s) refused, e.g. {why}" in penalty.reason
    assert [d.peer for d in of(out, Discovered)] == [ident(7).peer_id]
    assert set(a.table) == {ident(7).peer_id}


def test_a_registration_must_be_the_senders_own_record() -> None:
    b = machine(2)
    out = b.handle(Received(ident(6).peer_id, Register(record=record(ident(5)))), 0)
    assert of(out, Penalize)[0].points == RECORD_PENALTIES["forged"]
    assert b.table == {}


def test_an_answer_nobody_asked_for_costs_the_sender() -> None:
    a = machine(1)
    out = a.handle(Received(ident(5).peer_id,
                            DiscoverResponse(records=(record(ident(6)),), cookie=1)), 0)
    assert of(out, Penalize)[0].points == PENALTY_UNSOLICITED
    assert a.table == {}


def test_a_late_answer_is_taken_without_blame_until_late_answer_ms() -> None:
    a, slow = machine(1, queries_per_minute=1), ident(5).peer_id  # no re-query meanwhile
    (query,) = [e for e in of(a.handle(PeerConnected(slow), 0), Send)
                if isinstance(e.message, DiscoverRequest)]
    a.handle(Tick(), QUERY_TIMEOUT_MS)  # we gave up on it
    assert a.pending == {}
    answer = DiscoverResponse(records=(record(ident(6)),), cookie=1)
    out = a.handle(Received(slow, answer), QUERY_TIMEOUT_MS + 5_000)
    assert of(out, Penalize) == [] and ident(6).peer_id in a.table
    # once taken, a second copy is unsolicited; so is one after LATE_ANSWER_MS
    out = a.handle(Received(slow, answer), QUERY_TIMEOUT_MS + 6_000)
    assert of(out, Penalize)[0].points == PENALTY_UNSOLICITED
    a.handle(SendFailed(slow, query.message, "timeout"), 0)  # not pending: nothing to give up
    a.pending[slow] = 20_000  # asked again, and its send reported failed
    a.handle(SendFailed(slow, query.message, "timeout"), 20_000)
    a.handle(Tick(), 20_000 + LATE_ANSWER_MS)
    out = a.handle(Received(slow, answer), 20_000 + LATE_ANSWER_MS)
    assert of(out, Penalize)[0].points == PENALTY_UNSOLICITED


def test_one_peer_relays_at_most_records_per_peer_into_the_table() -> None:
    a, hostile, honest = machine(1, records_per_peer=4), ident(2), ident(3)
    a.handle(PeerConnected(hostile.peer_id), 0)
    sybils = tuple(record(ident(50 + i)) for i in range(10))
    out = a.handle(Received(hostile.peer_id, DiscoverResponse(records=sybils, cookie=9)), 0)
    assert len(of(out, Discovered)) == 4 and len(a.table) == 4
    assert len([e for e in of(out, Emit) if e.event == "discovery_quota"]) == 6
    assert of(out, Penalize) == []  # signed records of real keys: not the relayer's fault
    # the hostile peer's own registration and other peers' relays still get in
    a.handle(Received(hostile.peer_id, Register(record=record(hostile))), 1)
    a.handle(PeerConnected(honest.peer_id), 1)
    a.handle(Received(honest.peer_id, DiscoverResponse(records=sybils[5:], cookie=3)), 1)
    assert len(a.table) == 4 + 1 + 4


def test_the_table_holds_max_records_and_makes_room_only_from_expired_ones() -> None:
    b = machine(2, max_records=3)
    for i in range(3):
        b.handle(Received(ident(20 + i).peer_id,
                          Register(record=record(ident(20 + i), ttl=10_000 * (i + 1)))), 0)
    out = b.handle(Received(ident(30).peer_id, Register(record=record(ident(30)))), 0)
    assert [e.event for e in of(out, Emit)] == ["discovery_full"] and len(b.table) == 3
    # once the first record is past its expiry (and the clock skew), it makes room
    late = 10_000 + b.config.max_clock_skew_ms
    b.handle(Received(ident(30).peer_id, Register(record=record(ident(30), issued=T0 + late))),
             late)
    assert ident(20).peer_id not in b.table and ident(30).peer_id in b.table


def test_requests_beyond_the_rate_are_dropped_and_charged() -> None:
    b, asker = machine(2), ident(5).peer_id
    answered = penalized = 0
    for i in range(MAX_REQUESTS_PER_MINUTE + 10):
        out = b.handle(Received(asker, DiscoverRequest(limit=1, cookie=i)), 100)
        answered += len(of(out, Send))
        penalized += sum(p.points == PENALTY_FLOOD for p in of(out, Penalize))
    assert (answered, penalized) == (MAX_REQUESTS_PER_MINUTE, 10)
    # the bucket refills at the rate: a minute later the peer is answered again
    assert of(b.handle(Received(asker, DiscoverRequest(limit=1, cookie=0)), 60_100), Send)


def test_our_queries_spend_queries_per_minute_and_time_out() -> None:
    a = machine(1, queries_per_minute=2)
    asked = []
    for i in range(5):
        out = a.handle(PeerConnected(ident(10 + i).peer_id), 0)
        asked += [e.peer for e in of(out, Send) if isinstance(e.message, DiscoverRequest)]
        assert len(of(out, Send)) >= 1  # the registration goes out whatever the budget
    assert len(asked) == 2
    assert a.next_deadline() == 0 + min(a.config.query_interval_ms, QUERY_TIMEOUT_MS)
    a.handle(Tick(), QUERY_TIMEOUT_MS)
    assert a.pending == {}
    # a failed send frees the peer to be asked again
    out = a.handle(Tick(), a.config.query_interval_ms)
    (query,) = [e for e in of(out, Send) if isinstance(e.message, DiscoverRequest)]
    a.handle(SendFailed(query.peer, query.message, "timeout"), a.config.query_interval_ms)
    assert query.peer not in a.pending


def test_we_register_again_at_half_the_ttl_with_a_fresh_signature() -> None:
    a, b = machine(1, record_ttl_ms=10_000), ident(2).peer_id
    first = [e.message for e in of(a.handle(PeerConnected(b), 0), Send)
             if isinstance(e.message, Register)]
    again = [e.message for e in of(a.handle(Tick(), 5_000), Send)
             if isinstance(e.message, Register)]
    assert len(first) == len(again) == 1 and encode(first[0]) != encode(again[0])
    rec = open_peer_record(again[0].record, network_id=NET, now_epoch_ms=T0 + 5_000,
                           max_skew_ms=0)
    assert rec.issued_at_ms == T0 + 5_000 and rec.ttl_ms == 10_000
    a.handle(PeerDisconnected(b), 6_000)
    assert a.next_deadline() is None


def test_switched_off_it_sends_nothing_and_blames_nobody() -> None:
    a = machine(1, enabled=False)
    assert a.handle(PeerConnected(ident(2).peer_id), 0) == []
    assert a.handle(Received(ident(2).peer_id, DiscoverResponse(records=(), cookie=0)), 0) == []
    assert a.next_deadline() is None


@pytest.mark.parametrize(("overrides", "named"), [
    ({"queries_per_minute": 0}, "queries_per_minute"),
    ({"queries_per_minute": MAX_REQUESTS_PER_MINUTE}, "queries_per_minute"),
    ({"record_ttl_ms": 10}, "record_ttl_ms"),
    ({"records_per_peer": 0}, "records_per_peer"),
])
def test_bad_limits_are_refused_by_name(overrides, named) -> None:
    with pytest.raises(ValueError, match=named):
        DiscoveryConfig(network_id=NET, **overrides)


FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HOSTILE = st.one_of(messages_of(Register), messages_of(DiscoverRequest),
                    messages_of(DiscoverResponse))


@FUZZ
@given(msgs=st.lists(HOSTILE, max_size=6), asked=st.booleans())
def test_hostile_messages_never_break_the_machine(msgs: list[Message], asked: bool) -> None:
    a, peer = machine(1, records_per_peer=3, max_records=4), SIGNERS[0].peer_id
    if asked:
        a.handle(PeerConnected(peer), 0)
    for i, msg in enumerate(msgs):
        if not isinstance(msg, (Register, DiscoverRequest, DiscoverResponse)):
            continue  # a draw its constructor refused: it could not be decoded either
        out = a.handle(Received(peer, msg), i)
        assert all(isinstance(e, (Send, Penalize, Discovered, Emit)) for e in out)
        assert all(p.peer == peer and p.points > 0 for p in of(out, Penalize))
    assert len(a.table) <= 4 and all(n <= 3 for n in a.relayed_by.values())


@FUZZ
@given(data=st.data())
def test_mutated_records_open_or_raise_record_refused_only(data: st.DataObject) -> None:
    frame = mutate(data, record(ident(5)).encode())
    try:
        envelope = Envelope.decode(frame)
    except ValueError:
        return
    try:
        rec = open_peer_record(envelope, network_id=NET, now_epoch_ms=T0, max_skew_ms=60_000)
    except RecordRefused as exc:
        assert exc.why in RECORD_PENALTIES
        return
    assert envelope.signer == rec.peer_id
