"""Finding peers again: the persistent peer store, several bootstrap entries, and networks
that never mix."""

from __future__ import annotations

import hashlib
import random
import socket
from pathlib import Path

import pytest

from crypto.keys import Identity
from node.db import Database
from node.p2p.mdns import parse_txt, service_type, txt_record
from node.p2p.peerstore import FORGET_AFTER_MS, MAX_STORED_PEERS, SCHEMA, PeerStore
from node.testnet import LocalTestnet, NodeProcess
from protocol.machine import Dial
from protocol.membership.machine import (
    AddBootstrap,
    AddKnown,
    Membership,
    MembershipConfig,
)
from tests.node.conftest import TESTNET_CONFIG, Testnet

CONVERGE_S = 30.0


def _peer(n: int) -> str:
    return Identity.from_seed(hashlib.sha256(b"peer%d" % n).digest()).peer_id


def _addr(peer: str, port: int = 4001) -> str:
    return f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer}"


def _store(tmp_path: Path) -> PeerStore:
    db = Database(tmp_path / "node.db")
    db.apply_schema(SCHEMA)
    return PeerStore(db)


def test_the_store_keeps_each_peers_own_addresses_newest_first(tmp_path: Path) -> None:
    store = _store(tmp_path)
    a, b = _peer(1), _peer(2)
    # an address of another peer is never stored under this one
    assert store.save([(a, (_addr(a), _addr(b, 5))), (b, (_addr(b),))], now_ms=1_000) == 2
    assert store.load() == [(a, (_addr(a),)), (b, (_addr(b),))]
    store.save([(b, (_addr(b, 4002),))], now_ms=2_000)
    assert store.load() == [(b, (_addr(b, 4002),)), (a, (_addr(a),))]
    # a week unseen: forgotten
    store.save([(b, (_addr(b),))], now_ms=2_000 + FORGET_AFTER_MS)
    assert [p for p, _ in store.load()] == [b]
    # bounded, the most recently seen stay
    many = [(_peer(n), (_addr(_peer(n)),)) for n in range(10, 10 + MAX_STORED_PEERS + 5)]
    for i, entry in enumerate(many):
        store.save([entry], now_ms=10 * FORGET_AFTER_MS + i)
    kept = [p for p, _ in store.load()]
    assert len(kept) == MAX_STORED_PEERS == store.count()
    assert kept[0] == many[-1][0] and many[0][0] not in kept


def test_stored_peers_are_dialled_after_the_bootstrap_peers() -> None:
    me, boot, known = _peer(1), _peer(2), _peer(3)
    m = Membership(config=MembershipConfig(network_id="n", agent_version="t", target_peers=1),
                   self_peer=me, rng=random.Random(1))
    m.handle(AddBootstrap((_addr(boot),)), 0)
    assert not [e for e in m.handle(AddKnown((_addr(known), _addr(me))), 0) if isinstance(e, Dial)]
    assert known in m.book and me not in m.book and not m.book[known].bootstrap
    m = Membership(config=MembershipConfig(network_id="n", agent_version="t"),
                   self_peer=me, rng=random.Random(1))
    dials = [e for e in m.handle(AddKnown((_addr(known),)), 0) if isinstance(e, Dial)]
    assert [d.peer for d in dials] == [known]


@pytest.mark.integration
def test_a_restarted_node_without_bootstrap_reconnects_from_its_peer_store(
        testnet: Testnet) -> None:
    b = testnet.start("b")  # no bootstrap, ever
    a = testnet.start("a", bootstrap=[b])
    testnet.wait_until(lambda: a.peer_id in b.ready_peers(), "b to accept a", CONVERGE_S)
    testnet.wait_until(lambda: b.status()["stored_peers"] >= 1, "b to store a", CONVERGE_S)
    b.restart()
    assert b.log_events("membership.peer_store_loaded")[-1]["peers"] >= 1
    testnet.wait_until(lambda: a.peer_id in b.ready_peers(), "b to reconnect to a", CONVERGE_S)
    # b dialled a (a's dials go to b's former port, which nothing listens on now)
    entry = next(p for p in b.status()["peers"] if p["peer_id"] == a.peer_id)
    assert entry["outbound"] is True


@pytest.mark.integration
def test_bootstrap_entries_are_tried_until_one_answers(testnet: Testnet) -> None:
    a = testnet.start("a")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    dead = _addr(_peer(99), dead_port)
    c = testnet.start("c", bootstrap=[dead, a])
    testnet.wait_until(lambda: a.peer_id in c.ready_peers(), "c to join through a", CONVERGE_S)


@pytest.mark.integration
def test_two_testnets_on_one_machine_never_mix(tmp_path: Path) -> None:
    alpha = LocalTestnet(tmp_path / "alpha", network_id="alpha", config=TESTNET_CONFIG)
    beta = LocalTestnet(tmp_path / "beta", network_id="beta", config=TESTNET_CONFIG)
    try:
        a1 = alpha.start("a1")
        a2 = alpha.start("a2", bootstrap=[a1])
        b1 = beta.start("b1", bootstrap=[a1])  # told to join the wrong network

        def refused(by: NodeProcess, peer: str) -> list[dict[str, object]]:
            return [e for e in by.log_events("membership.peer_refused") if e["peer"] == peer]

        # both sides say why, naming both network ids
        for by, other in ((a1, b1), (b1, a1)):
            (line, *_) = alpha.wait_until(lambda by=by, other=other: refused(by, other.peer_id),
                                          f"{by.name} to refuse {other.name}", CONVERGE_S)
            assert "'alpha'" in str(line["reason"]) and "'beta'" in str(line["reason"])
        alpha.wait_until(lambda: a2.peer_id in a1.ready_peers(), "a1 and a2 to meet", CONVERGE_S)
        assert b1.ready_peers() == set()
        assert a1.ready_peers() == {a2.peer_id} and a2.ready_peers() == {a1.peer_id}
    finally:
        alpha.kill_all()
        beta.kill_all()


def test_mdns_txt_records_carry_one_peers_addresses() -> None:
    me, other = _peer(1), _peer(2)
    raw = txt_record([_addr(me), "/ip4/999.0.0.1/tcp/1/p2p/" + me, _addr(me, 4002),
                      "/ip4/1.2.3.4/tcp/1/p2p/" + other, "/ip4/1.2.3.4/tcp/1/p2p/" + "x" * 300])
    assert parse_txt(raw) == (_addr(me), _addr(me, 4002))
    assert parse_txt(raw[:-5]) == (_addr(me), _addr(me, 4002))  # cut short: the rest dropped
    assert parse_txt(b"\x05hello") == ()
    assert service_type("symphony-main") != service_type("othernet")
    assert len(service_type("a" * 32).split(".")[0]) <= 16  # "_" + at most 15 characters


@pytest.mark.integration
def test_nodes_on_one_lan_find_each_other_by_mdns(tmp_path: Path) -> None:
    # a network id of this run only, so that no other test's daemons answer
    network = "mdns-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]
    net = LocalTestnet(tmp_path / "net", network_id=network,
                       config={**TESTNET_CONFIG, "membership": {
                           **TESTNET_CONFIG["membership"], "mdns": True}})
    try:
        a = net.start("a")
        b = net.start("b")  # no bootstrap: only mDNS can bring them together
        net.wait_until(lambda: a.peer_id in b.ready_peers() and b.peer_id in a.ready_peers(),
                       "a and b to find each other on the LAN", CONVERGE_S)
        # whichever announced itself first was found by the other (or both, each other)
        assert all(x.status()["mdns"]["running"] for x in (a, b))
        found = [e["peer"] for x in (a, b) for e in x.log_events("membership.mdns_found")]
        assert set(found) & {a.peer_id, b.peer_id}
        assert sum(x.status()["mdns"]["found"] for x in (a, b)) >= 1
        off = net.start("off", config={"membership": {"mdns": False}})
        assert off.status()["mdns"] == {"enabled": False, "running": False, "found": 0,
                                        "dropped": 0, "problem": ""}
    finally:
        net.kill_all()
