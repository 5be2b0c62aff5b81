"""Hole punching between two nodes behind two different NATs (TCP simultaneous open), on one
machine: five network namespaces, nftables masquerading (tests/node/test_nat.py builds one NAT
with daemons; this builds two, with plain transports: tests/node/nat_peer.py).

Layout (``S`` is a per-run suffix, ``N`` a per-run subnet number)::

    "internet" namespace: relay C at 172.31.N.1, forwarding between the two routers
    router 1: 172.31.N.2 outside, 10.31.N.1 inside --- A at 10.31.N.2
    router 2: 172.30.N.2 outside, 10.30.N.1 inside --- B at 10.30.N.2

Each router masquerades what leaves, forwards nothing new from outside, and drops new
connections to itself from outside (as home routers do: answering them with a reset would
tell the puncher "refused" and end its attempt). Masquerading keeps a source port while it is
free, so a node's listening port maps to the same port on its router.

A reserves a slot on C; B dials A through C and sends an echo over the relayed connection;
A starts DCUtR, its plain dial to B fails (B's router drops it), and then both dial each other
from their listening ports at once: B's router sees A's SYN as the answer to B's own, and the
connection is direct. Needs root, ``ip netns`` and ``nft``; skips with the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.node.netns import NatPeer, opened, sh

pytestmark = pytest.mark.integration

PEER_TIMEOUT_S = 90


class TwoNats:
    """The namespaces of the module docstring; ``close()`` removes them (and their links)."""

    def __init__(self) -> None:
        n, s = os.getpid() % 250 + 1, f"{os.getpid() % 10000:04d}"
        self.inet, self.r1, self.a, self.r2, self.b = (f"h19{x}{s}" for x in "irapb")
        self.relay_ip = f"172.31.{n}.1"
        self.a_ip, self.b_ip = f"10.31.{n}.2", f"10.30.{n}.2"
        self._n, self._s = n, s

    def open(self) -> None:
        n, s = self._n, self._s
        for ns in (self.inet, self.r1, self.a, self.r2, self.b):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "netns", "exec", self.inet, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sides = ((self.r1, self.a, "172.31", "10.31", "1"), (self.r2, self.b, "172.30", "10.30", "2"))
        for router, host, outside, inside, k in sides:
            out_i, out_r, in_r, in_h = (f"h19{x}{k}{s}" for x in "oqgh")
            self._link(self.inet, out_i, f"{outside}.{n}.1", router, out_r, f"{outside}.{n}.2")
            self._link(router, in_r, f"{inside}.{n}.1", host, in_h, f"{inside}.{n}.2")
            sh("ip", "-n", router, "route", "add", "default", "via", f"{outside}.{n}.1")
            sh("ip", "-n", host, "route", "add", "default", "via", f"{inside}.{n}.1")
            sh("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            ruleset = "\n".join([
                "table ip nat {", "  chain masq {", "    type nat hook postrouting priority 100;",
                f'    oifname "{out_r}" masquerade', "  }", "}",
                "table ip filter {", "  chain block_inbound {",
                "    type filter hook forward priority 0; policy drop;",
                "    ct state established,related accept", f'    iifname "{in_r}" accept',
                "  }", "  chain quiet_router {",
                "    type filter hook input priority 0; policy accept;",
                f'    iifname "{out_r}" ct state new drop', "  }", "}", ""])
            subprocess.run(["ip", "netns", "exec", router, "nft", "-f", "-"], input=ruleset,
                           check=True, text=True, capture_output=True, timeout=30)

    @staticmethod
    def _link(ns1: str, if1: str, ip1: str, ns2: str, if2: str, ip2: str) -> None:
        sh("ip", "link", "add", if1, "netns", ns1, "type", "veth", "peer", "name", if2,
            "netns", ns2)
        for ns, dev, ip in ((ns1, if1, ip1), (ns2, if2, ip2)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")

    def close(self) -> None:
        for ns in (self.a, self.b, self.r1, self.r2, self.inet):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.fixture
def nats() -> Iterator[TwoNats]:
    yield from opened(TwoNats(), "the NATs")


def test_two_nodes_behind_two_nats_punch_a_direct_connection(nats: TwoNats) -> None:
    peers: list[NatPeer] = []
    try:
        relay = NatPeer(nats.inet, "relay", f"/ip4/{nats.relay_ip}/tcp/0")
        peers.append(relay)
        relay_addr = relay.next()["addrs"][0]
        a = NatPeer(nats.a, "target", f"/ip4/{nats.a_ip}/tcp/0", relay_addr)
        peers.append(a)
        a.next()
        assert a.next()["candidates"][0].startswith(f"/ip4/172.31.{nats._n}.2/tcp/")
        relayed = a.next()["relayed"][0]
        b = NatPeer(nats.b, "dialer", f"/ip4/{nats.b_ip}/tcp/0", relay_addr, relayed)
        peers.append(b)
        b.next()
        assert b.next()["candidates"][0].startswith(f"/ip4/172.30.{nats._n}.2/tcp/")
        assert b.next() == {"echo": "ping"}  # over the relayed connection
        assert b.next() == {"direct": True, "punch": {"punched": 1}}
    finally:
        for peer in peers:
            peer.stop()
