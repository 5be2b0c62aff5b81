"""Rendezvous discovery between real daemons on loopback: a node told of one peer only finds
and connects to peers it was never told about, through the signed records that peer keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.testnet import NodeProcess
from tests.node.conftest import TEST_NETWORK_ID, TESTNET_CONFIG, Testnet

CONVERGE_S = 30.0
#: peer exchange off, so that only rendezvous records can introduce two nodes
ONLY_DISCOVERY = {"membership": {**TESTNET_CONFIG["membership"], "peer_exchange": False,
                                 "discovery_queries_per_minute": 30}}


def _discovered(by: NodeProcess, peer: NodeProcess) -> list[dict[str, object]]:
    return [e for e in by.log_events("discovery.discovered") if e["peer"] == peer.peer_id]


@pytest.mark.integration
def test_nodes_told_of_one_peer_connect_to_peers_they_were_never_told_of(
        tmp_path: Path) -> None:
    net = Testnet(tmp_path / "net", network_id=TEST_NETWORK_ID,
                  config={**TESTNET_CONFIG, **ONLY_DISCOVERY})
    try:
        b = net.start("b")
        c = net.start("c", bootstrap=[b], wait=False)
        # the control: discovery off, so nobody learns of it but the peer it dials
        off = net.start("off", bootstrap=[b], config={"membership": {"discovery": False}},
                        wait=False)
        a = net.start("a", bootstrap=[b], wait=False)
        for node in (c, off, a):
            node.wait_ready()
        net.wait_until(lambda: {b.peer_id, c.peer_id} <= a.ready_peers(), "a to reach c",
                       CONVERGE_S)
        net.wait_until(lambda: a.peer_id in c.ready_peers(), "c to reach a", CONVERGE_S)
        # whichever joined b second learnt the other from b's signed records and dialled it
        # (the first then got the dialler's own registration)
        assert _discovered(a, c)[0]["via"] in (b.peer_id, c.peer_id)
        assert any(e["via"] == b.peer_id for e in _discovered(c, a) + _discovered(a, c))
        assert sum(n.status()["services"]["discovery"]["discovered"] for n in (a, c)) >= 1
        # with neither discovery nor peer exchange, the control knows b alone, and nobody
        # learnt of it, though a and c have asked their peers again and again
        net.wait_until(lambda: a.status()["services"]["discovery"]["queries"] >= 3,
                       "a to ask its peers three times", CONVERGE_S)
        assert b.status()["services"]["discovery"]["records"] >= 2  # a's and c's
        assert off.ready_peers() == {b.peer_id}
        assert not _discovered(a, off) and not _discovered(c, off)
        assert off.peer_id not in a.ready_peers() | c.ready_peers()
        for node in (a, b, c):  # honest nodes never charge each other
            assert not node.status()["penalties"], node.status()["penalties"]
    finally:
        net.kill_all()
        if any(n.running for n in net.nodes.values()):
            print(net.log_tails(80))
