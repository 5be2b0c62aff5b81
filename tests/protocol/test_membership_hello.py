"""The membership machine's Hello when the driver reports it undelivered: sent again while the
connection lasts, a bounded number of times, and only a Hello."""

from __future__ import annotations

from protocol.machine import Disconnect, PeerConnected, PeerDisconnected, Send, SendFailed, Tick
from protocol.membership.machine import MAX_HELLO_RESENDS
from protocol.membership.messages import Hello, Ping
from tests.protocol.membership_net import A, B, machine, of, ready


def test_an_undelivered_hello_is_sent_again_a_bounded_number_of_times() -> None:
    m = machine()
    [first] = of(m.handle(PeerConnected(A, outbound=True), 0), Send)
    for attempt in range(MAX_HELLO_RESENDS):
        [again] = of(m.handle(SendFailed(A, first.message, "no ack within 10.0 s"), attempt), Send)
        assert again.peer == A and again.message == first.message
    assert m.handle(SendFailed(A, first.message, "no ack within 10.0 s"), 9) == []
    # the peer's Hello still makes it ready: nothing else changed
    assert not m.is_ready(A)


def test_a_ready_peer_that_never_got_our_hello_gets_it_again() -> None:
    # we took the peer's Hello, ours to it was lost: it would drop us at its Hello timeout
    m = machine()
    ready(m, A)
    [again] = of(m.handle(SendFailed(A, m._hello(), "refused"), 1), Send)
    assert isinstance(again.message, Hello)


def test_no_resend_to_a_peer_gone_or_being_dropped_nor_of_other_messages() -> None:
    m = machine(hello_timeout_ms=1000)
    m.handle(PeerConnected(A), 0)
    hello = m._hello()
    assert of(m.handle(Tick(), 1000), Disconnect)  # A is being dropped (no Hello from it)
    assert m.handle(SendFailed(A, hello, "timeout"), 1001) == []
    m.handle(PeerDisconnected(A), 1002)
    assert m.handle(SendFailed(A, hello, "timeout"), 1003) == []
    ready(m, B, 2000)
    assert m.handle(SendFailed(B, Ping(nonce=1), "timeout"), 2001) == []


def test_a_new_connection_has_its_own_resends() -> None:
    m = machine()
    m.handle(PeerConnected(A), 0)
    hello = m._hello()
    for t in range(MAX_HELLO_RESENDS + 1):
        m.handle(SendFailed(A, hello, "timeout"), t)
    m.handle(PeerDisconnected(A), 10)
    m.handle(PeerConnected(A), 20)
    assert of(m.handle(SendFailed(A, hello, "timeout"), 21), Send)
