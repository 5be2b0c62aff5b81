"""The membership machine when a node's addresses change (a relay reservation comes or goes):
its peers are told in a new Hello, and a repeated Hello teaches its addresses."""

from __future__ import annotations

from protocol.machine import PeerConnected, Received, Send
from protocol.membership.machine import SetListenAddrs
from protocol.membership.messages import Hello
from tests.protocol.membership_net import ME, A, B, addr, machine, of, ready

RELAYED = f"/ip4/127.0.0.1/tcp/9/p2p/{B}/p2p-circuit/p2p/{ME}"


def test_new_addresses_go_to_every_connected_peer_in_a_hello() -> None:
    m = machine()
    ready(m, A)
    m.handle(PeerConnected(B), 0)  # still awaiting its Hello: told too
    out = m.handle(SetListenAddrs((addr(ME), RELAYED)), 10)
    sends = of(out, Send)
    assert sorted(s.peer for s in sends) == sorted([A, B])
    assert all(isinstance(s.message, Hello) and s.message.listen_addrs == (addr(ME), RELAYED)
               for s in sends)
    assert of(m.handle(SetListenAddrs((addr(ME), RELAYED)), 20), Send) == []  # unchanged


def test_a_repeated_hello_teaches_the_peers_new_addresses_and_only_its_own() -> None:
    m = machine()
    ready(m, A)
    relayed_a = f"/ip4/127.0.0.1/tcp/9/p2p/{B}/p2p-circuit/p2p/{A}"
    foreign = addr(B, 5000)  # a peer may not vouch for another's address
    m.handle(Received(A, Hello(network_id="testnet", protocol_version=1, agent_version="t/1",
                               listen_addrs=(addr(A), relayed_a, foreign))), 5)
    assert m.book[A].addrs == (addr(A), relayed_a)
    assert B not in m.book
    assert m.is_ready(A)
