"""The membership machine, driven directly: handshake, refusal, latency, exchange, redial."""

from __future__ import annotations

import random

import pytest

from protocol.machine import (
    Dial,
    DialFailed,
    Disconnect,
    Emit,
    PeerConnected,
    PeerDisconnected,
    Received,
    Send,
    Tick,
)
from protocol.membership.machine import (
    MAX_FAILURES,
    AddBootstrap,
    ConnState,
)
from protocol.membership.messages import Hello, PeerList, PeerListRequest, Ping, Pong
from tests.protocol.membership_net import ME, A, B, C, addr, hello, machine, of, ready


def test_connect_sends_hello_and_hello_makes_ready() -> None:
    m = machine()
    out = m.handle(PeerConnected(A, outbound=True), 0)
    [send] = of(out, Send)
    assert send.peer == A and isinstance(send.message, Hello)
    assert send.message.listen_addrs == (addr(ME),)
    assert m.conns[A].state is ConnState.AWAITING_HELLO
    out = m.handle(Received(A, hello(A)), 5)
    assert m.is_ready(A)
    assert any(isinstance(e, Emit) and e.event == "peer_ready" for e in out)


@pytest.mark.parametrize(
    "msg, words",
    [(hello(A, network="othernet"), "network id 'othernet'"),
     (hello(A, version=99), "protocol version 99")],
)
def test_foreign_network_or_version_is_refused_with_reason(msg: Hello, words: str) -> None:
    m = machine()
    m.handle(PeerConnected(A), 0)
    out = m.handle(Received(A, msg), 1)
    [disc] = of(out, Disconnect)
    assert words in disc.reason and "testnet" in disc.reason or "1)" in disc.reason
    assert not m.is_ready(A)
    m.handle(PeerDisconnected(A), 2)
    assert m.dropped[-1].peer == A and words in m.dropped[-1].reason
    # not redialled soon
    assert not of(m.handle(Tick(), 60_000), Dial)


def test_no_hello_times_out() -> None:
    m = machine(hello_timeout_ms=1000)
    m.handle(PeerConnected(A), 0)
    assert m.next_deadline() == 1000
    assert not of(m.handle(Tick(), 999), Disconnect)
    [disc] = of(m.handle(Tick(), 1000), Disconnect)
    assert disc.reason == "no hello within the timeout"


def test_messages_before_hello_are_ignored() -> None:
    m = machine()
    m.handle(PeerConnected(A), 0)
    assert m.handle(Received(A, PeerListRequest(max_peers=5)), 1) == []


def test_a_message_under_our_own_peer_id_is_ignored() -> None:
    m = machine()
    for msg in (hello(ME), Ping(nonce=1), PeerListRequest(max_peers=5)):
        assert m.handle(Received(ME, msg), 1) == []
    assert ME not in m.conns


def test_ping_measures_latency_and_silence_drops() -> None:
    m = machine(ping_interval_ms=1000, unresponsive_after_ms=3000)
    m.handle(PeerConnected(A), 0)
    out = m.handle(Received(A, hello(A)), 0)
    [ping] = [s for s in of(out, Send) if isinstance(s.message, Ping)]
    m.handle(Received(A, Pong(nonce=ping.message.nonce + 1)), 10)  # wrong nonce: ignored
    assert m.conns[A].rtt_ms is None
    m.handle(Received(A, Pong(nonce=ping.message.nonce)), 12)
    assert m.conns[A].rtt_ms == 12
    # we answer pings
    out = m.handle(Received(A, Ping(nonce=77)), 20)
    assert Send(A, Pong(nonce=77)) in out
    # silence: dropped as unresponsive 3000 ms after the last message
    assert not of(m.handle(Tick(), 3019), Disconnect)
    [disc] = of(m.handle(Tick(), 3020), Disconnect)
    assert disc.reason == "unresponsive"


def test_bootstrap_dial_and_backoff_after_failures() -> None:
    m = machine(backoff_base_ms=100, backoff_max_ms=1000)
    out = m.handle(AddBootstrap((addr(A),)), 0)
    [dial] = of(out, Dial)
    assert dial.peer == A and dial.addrs == (addr(A),)
    assert not of(m.handle(Tick(), 1), Dial)  # already dialling
    delays = []
    now = 0
    for _ in range(MAX_FAILURES + 2):  # bootstrap peers are never forgotten
        m.handle(DialFailed(A, "refused"), now)
        due = m.next_deadline()
        assert due is not None and due > now
        delays.append(due - now)
        assert not of(m.handle(Tick(), due - 1), Dial)
        assert of(m.handle(Tick(), due), Dial)
        now = due
    assert delays[1] > delays[0]  # exponential
    assert max(delays) <= 1000 * 1.25 + 1  # capped, plus jitter


def test_non_bootstrap_peer_forgotten_after_max_failures() -> None:
    m = machine(backoff_base_ms=1, backoff_max_ms=1)
    m.handle(PeerConnected(A), 0)
    m.handle(Received(A, PeerList(peers=())), 0)  # before the handshake: ignored
    # the first ready peer is asked for its peers at once
    out = m.handle(Received(A, hello(A)), 0)
    reqs = [s for s in of(out, Send) if isinstance(s.message, PeerListRequest)]
    assert [r.peer for r in reqs] == [A]
    from protocol.membership.messages import PeerInfo
    out = m.handle(Received(A, PeerList(peers=(PeerInfo(peer_id=B, addrs=(addr(B),)),))), 1)
    assert [d.peer for d in of(out, Dial)] == [B]
    now = 1
    for _ in range(MAX_FAILURES):
        m.handle(DialFailed(B, "refused"), now)
        now += 10
        m.handle(Tick(), now)
    assert B not in m.book


def test_peer_exchange_only_vouches_for_own_addresses() -> None:
    m = machine()
    ready(m, A)  # the first ready peer is asked for peers at once
    from protocol.membership.messages import PeerInfo
    # A claims an address for C that ends in B's id: ignored
    bogus = PeerInfo(peer_id=C, addrs=(addr(B),))
    m.handle(Received(A, PeerList(peers=(bogus,))), 1)
    assert B not in m.book and C not in m.book


def test_answer_peer_list_excludes_asker_and_unaddressed() -> None:
    m = machine()
    ready(m, A)
    ready(m, B)
    out = m.handle(Received(A, PeerListRequest(max_peers=10)), 3)
    [reply] = [s for s in of(out, Send) if isinstance(s.message, PeerList)]
    assert reply.peer == A
    assert [p.peer_id for p in reply.message.peers] == [B]


def test_target_limits_dials_and_lost_peer_is_redialled() -> None:
    m = machine(target_peers=1, backoff_base_ms=100)
    out = m.handle(AddBootstrap((addr(A), addr(B))), 0)
    assert len(of(out, Dial)) == 1
    m.handle(PeerConnected(A, outbound=True), 5)
    m.handle(Received(A, hello(A)), 5)
    assert not of(m.handle(Tick(), 6), Dial)
    out = m.handle(PeerDisconnected(A), 10)
    assert any(isinstance(e, Emit) and e.event == "peer_gone" for e in out)
    assert m.dropped[-1].reason == "connection closed"
    # B (due long ago) replaces A at once; A itself waits out its backoff
    assert [d.peer for d in of(out, Dial)] == [B]
    m.handle(DialFailed(B, "refused"), 11)
    due = m.next_deadline()
    assert due is not None and due > 11
    assert not of(m.handle(Tick(), due - 1), Dial)
    assert len(of(m.handle(Tick(), due), Dial)) == 1


def test_self_connections_ignored() -> None:
    m = machine()
    assert m.handle(PeerConnected(ME), 0) == []
    m.handle(AddBootstrap((addr(ME),)), 0)
    assert ME not in m.book


def test_deadline_always_moves_past_now() -> None:
    """A driver that ticks at next_deadline() must never spin: after a Tick at t the next
    deadline is later than t (over a random run of connects, hellos and disconnects)."""
    rng = random.Random(3)
    m = machine(backoff_base_ms=50)
    m.handle(AddBootstrap((addr(A), addr(B))), 0)
    peers = [A, B, C]
    now = 0
    for _ in range(300):
        now += rng.randrange(0, 400)
        peer = rng.choice(peers)
        action = rng.randrange(5)
        if action == 0:
            m.handle(PeerConnected(peer), now)
        elif action == 1:
            m.handle(Received(peer, hello(peer)), now)
        elif action == 2:
            m.handle(PeerDisconnected(peer), now)
        elif action == 3:
            m.handle(DialFailed(peer, "x"), now)
        m.handle(Tick(), now)
        due = m.next_deadline()
        assert due is None or due > now, (due, now)


def test_no_spin_while_every_ready_peer_is_closing() -> None:
    """A ready peer we dropped as unresponsive stays READY until the driver reports the
    disconnect; the peer-exchange deadline must not count it, or the node wakes at once
    forever (seen as a daemon whose event loop spun in the membership timers under load)."""
    m = machine()
    ready(m, A, now=0)
    now = 0
    while A not in m._closing:
        now += 1_000
        m.handle(Tick(), now)
    due = m.next_deadline()
    assert due is None or due > now, (due, now)
