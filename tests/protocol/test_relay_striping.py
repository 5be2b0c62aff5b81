"""The striped relay plan (protocol/relay/striping.py) and the machine fetching by stripes."""

from __future__ import annotations

import random

import pytest

from protocol.machine import Emit, Received, Send, Tick
from protocol.relay.events import (
    AttestWithheld,
    ChunkReceived,
    RequestChunk,
    StoreChunk,
    VersionPrepared,
)
from protocol.relay.machine import RelayMachine
from protocol.relay.manifest import RelayProgress
from protocol.relay.plan import PlanInputs
from protocol.relay.striping import build_striped_plan
from tests.protocol.relay_net import Net, identity, manifest_for

MBIT = 1024 * 1024 // 8
SIZE = 256 << 20
CHUNK = 1 << 20


def plan_for(uploads: list[int], stripes: int = 4, root_up: int = 100 * MBIT):
    return build_striped_plan(
        PlanInputs("root", root_up, tuple((f"p{i}", u) for i, u in enumerate(uploads)),
                   total_size=SIZE, chunk_size=CHUNK, seed=b"seed"),
        stripes=stripes,
    )


def check_trees(plan, n: int) -> None:
    for tree in plan.trees:
        assert len(tree.parent) == n  # every recipient has one parent in every stripe
        assert tree.depth["root"] == 0
        for peer, parent in tree.parent.items():
            assert tree.depth[peer] == tree.depth[parent] + 1
        assert max(len(c) for c in tree.children.values()) <= 8


@pytest.mark.parametrize("n", [5, 37, 200, 1000])
def test_equal_links_every_uplink_works_once(n: int) -> None:
    plan = plan_for([100 * MBIT] * n)
    check_trees(plan, n)
    interior = [len(plan.interior_stripes(f"p{i}")) for i in range(n)]
    # each node feeds children in at most one stripe; the single tree leaves about half idle
    assert max(interior) <= 1, interior
    assert sum(interior) >= n * 3 // 4
    assert plan.rate_bps == pytest.approx(100 * MBIT)
    assert plan.estimated_ms < SIZE / (100 * MBIT) * 1000 * 1.1


def test_slow_nodes_and_free_riders_are_leaves_in_every_stripe() -> None:
    mix = [10, 50, 100, 1000]
    uploads = [mix[i % 4] * MBIT for i in range(400)]
    uploads[7] = 1  # advertised at 1 B/s: a detected free rider
    plan = plan_for(uploads)
    check_trees(plan, 400)
    assert plan.interior_stripes("p7") == []
    for i in range(0, 400, 4):  # the 10 Mbit/s uplinks
        assert plan.interior_stripes(f"p{i}") == [], i


def test_same_inputs_in_any_order_give_the_same_plan() -> None:
    uploads = [random.Random(3).choice([10, 100, 1000]) * MBIT for _ in range(150)]
    recipients = [(f"p{i}", u) for i, u in enumerate(uploads)]
    shuffled = recipients[:]
    random.Random(4).shuffle(shuffled)
    a = build_striped_plan(PlanInputs("root", 100 * MBIT, tuple(recipients), total_size=SIZE,
                                      chunk_size=CHUNK, seed=b"s"), stripes=4)
    b = build_striped_plan(PlanInputs("root", 100 * MBIT, tuple(shuffled), total_size=SIZE,
                                      chunk_size=CHUNK, seed=b"s"), stripes=4)
    assert a == b


def test_one_stripe_or_few_peers_is_the_single_tree() -> None:
    assert plan_for([100 * MBIT] * 50, stripes=1).stripes == 1
    assert plan_for([100 * MBIT] * 3, stripes=4).stripes == 1
    with pytest.raises(ValueError, match="stripes"):
        plan_for([100 * MBIT] * 3, stripes=0)


PUB = identity(1)
IDS = [identity(n).peer_id for n in range(2, 14)]


def test_striped_relay_completes_each_stripe_from_its_parent() -> None:
    n = Net.of([PUB.peer_id, *IDS], stripes=4)
    m = manifest_for(PUB, IDS, chunks=16)
    n.publish(PUB.peer_id, m)
    assert n.complete(m) == set(IDS)
    plan = n.machines[IDS[0]].transfers[m.id].plan
    assert 2 <= plan.stripes <= 4  # the stripe count with the smallest estimate
    for peer in IDS:
        for s in n.effects(StoreChunk, peer):
            assert s.peer == plan.trees[plan.stripe_of(s.index)].parent[peer]
    # every recipient uploads something: no idle leaf
    assert all(plan.children_of(p) for p in IDS)


def test_a_parent_waiting_on_its_own_download_is_not_dropped() -> None:
    m = manifest_for(PUB, IDS[:2], chunks=4)
    me_id = IDS[1]
    me = RelayMachine(me_id, stripes=1, stall_timeout_ms=500)
    me.handle(Received(PUB.peer_id, m.message), 0)
    plan = me.transfers[m.id].plan.trees[0]
    parent = plan.parent[me_id]
    if parent == PUB.peer_id:
        me_id, parent = IDS[0], IDS[1]
        me = RelayMachine(me_id, stripes=1, stall_timeout_ms=500)
        me.handle(Received(PUB.peer_id, m.message), 0)
    effects = me.handle(VersionPrepared(m.id, frozenset()), 0)
    assert {e.peer for e in effects if isinstance(e, RequestChunk)} == {parent}
    # the parent reports it is still fetching: its silence gets one more timeout
    me.handle(Received(parent, RelayProgress(manifest_id=m.id, chunks_held=0)), 400)
    assert not [e for e in me.handle(Tick(), 1_000) if isinstance(e, AttestWithheld)]
    effects = me.handle(Tick(), 1_400)  # then it counts as stalled and is dropped ...
    assert any(isinstance(e, Emit) and e.event == "source_failed" for e in effects)
    # ... but not blamed: it said it held nothing. Once it says it holds what we asked
    # and still sends nothing for a stall timeout, it is a free rider
    assert AttestWithheld(parent, m.id) not in effects
    me.handle(Received(parent, RelayProgress(manifest_id=m.id, chunks_held=4)), 2_000)
    assert AttestWithheld(parent, m.id) not in me.handle(Tick(), 2_400)
    assert me.next_deadline() == 2_500
    assert AttestWithheld(parent, m.id) in me.handle(Tick(), 2_500)


def test_a_dropped_parent_that_serves_later_is_not_blamed() -> None:
    m = manifest_for(PUB, IDS[:2], chunks=4)
    probe = RelayMachine(IDS[0], stripes=1)
    probe.handle(Received(PUB.peer_id, m.message), 0)
    tree = probe.transfers[m.id].plan.trees[0]
    me_id = next(p for p in IDS[:2] if tree.parent[p] != PUB.peer_id)
    parent = tree.parent[me_id]
    me = RelayMachine(me_id, stripes=1, stall_timeout_ms=500)
    me.handle(Received(PUB.peer_id, m.message), 0)
    me.handle(VersionPrepared(m.id, frozenset()), 0)
    me.handle(Received(parent, RelayProgress(manifest_id=m.id, chunks_held=0)), 400)
    me.handle(Tick(), 1_400)  # dropped while behind: a suspect
    me.handle(Received(parent, RelayProgress(manifest_id=m.id, chunks_held=4)), 2_000)
    # our request was still queued there: the chunk comes, and clears it
    me.handle(ChunkReceived(parent, m.id, 0, m.chunk_hashes[0]), 2_100)
    assert me.next_deadline() != 2_500
    assert AttestWithheld(parent, m.id) not in me.handle(Tick(), 2_600)


def test_progress_goes_to_children_and_the_publisher_not_to_gossip() -> None:
    n = Net.of([PUB.peer_id, *IDS], stripes=4)
    m = manifest_for(PUB, IDS, chunks=16)
    n.publish(PUB.peer_id, m)
    plan = n.machines[IDS[0]].transfers[m.id].plan
    sent = {e.peer for p, e in n.log if p == IDS[0] and isinstance(e, Send)
            and isinstance(e.message, RelayProgress)}
    assert sent == {*plan.children_of(IDS[0]), PUB.peer_id}
    assert n.machines[PUB.peer_id].transfers[m.id].progress == {p: 16 for p in IDS}


def test_a_parent_that_holds_what_we_asked_and_sends_nothing_is_a_free_rider() -> None:
    m = manifest_for(PUB, IDS[:2], chunks=4)
    probe = RelayMachine(IDS[0], stripes=1)
    probe.handle(Received(PUB.peer_id, m.message), 0)
    plan = probe.transfers[m.id].plan.trees[0]
    child = next(p for p in IDS[:2] if plan.parent[p] != PUB.peer_id)
    parent = plan.parent[child]
    me = RelayMachine(child, stripes=1, stall_timeout_ms=500)
    me.handle(Received(PUB.peer_id, m.message), 0)
    me.handle(VersionPrepared(m.id, frozenset()), 0)
    # it claims to hold every chunk: no excuse for its silence
    me.handle(Received(parent, RelayProgress(manifest_id=m.id, chunks_held=4)), 100)
    effects = me.handle(Tick(), 500)
    assert AttestWithheld(parent, m.id) in effects
    again = me.handle(Received(parent, RelayProgress(manifest_id=m.id, chunks_held=4)), 600)
    assert not [e for e in again if isinstance(e, AttestWithheld)]


def test_reported_free_riders_become_leaves_in_the_next_plan() -> None:
    from protocol.relay.recipients import FREE_RIDER_UPLOAD_BPS, plan_recipients, withholders

    peers = [f"p{i}" for i in range(40)]
    uploads = {p: 100 * MBIT for p in peers}
    reports = withholders([("p3", "p9"), ("p3", "p10"), ("p5", "p5")])
    assert reports == {"p3": {"p9", "p10"}}  # nobody reports itself
    recipients = plan_recipients(peers, uploads, reports)
    assert dict(recipients)["p3"] == FREE_RIDER_UPLOAD_BPS
    assert dict(recipients)["p5"] == 100 * MBIT
    plan = build_striped_plan(PlanInputs("root", 100 * MBIT, tuple(recipients), total_size=SIZE,
                                         chunk_size=CHUNK, seed=b"v2"), stripes=4)
    assert plan.interior_stripes("p3") == []
    assert dict(plan_recipients(peers, uploads, reports, min_reports=3))["p3"] == 100 * MBIT
    with pytest.raises(ValueError, match="min_reports"):
        plan_recipients(peers, uploads, reports, min_reports=0)


def test_a_parent_behind_in_our_stripe_is_excused_though_ahead_in_total() -> None:
    m = manifest_for(PUB, IDS, chunks=16)
    probe = RelayMachine(IDS[0], stripes=4)
    probe.handle(Received(PUB.peer_id, m.message), 0)
    plan = probe.transfers[m.id].plan
    me = next(p for p in IDS if plan.trees[1].depth[p] >= 2)
    parent = plan.trees[1].parent[me]
    machine = RelayMachine(me, stripes=4, stall_timeout_ms=500)
    machine.handle(Received(PUB.peer_id, m.message), 0)
    machine.handle(VersionPrepared(m.id, frozenset()), 0)
    s = plan.stripes  # the count with the smallest estimate, here 2 or more
    # it holds 9 chunks in all, none of stripe 1 (chunks 1, 1 + s, ...): waiting on its parent
    behind = RelayProgress(manifest_id=m.id, chunks_held=9,
                           stripes_held=tuple(0 if k == 1 else 9 for k in range(s)))
    machine.handle(Received(parent, behind), 400)
    assert AttestWithheld(parent, m.id) not in machine.handle(Tick(), 1_000)
    # the same total with stripe 1 held: no excuse
    other = RelayMachine(me, stripes=4, stall_timeout_ms=500)
    other.handle(Received(PUB.peer_id, m.message), 0)
    other.handle(VersionPrepared(m.id, frozenset()), 0)
    ahead = RelayProgress(manifest_id=m.id, chunks_held=9,
                          stripes_held=tuple(3 if k == 1 else 1 for k in range(s)))
    other.handle(Received(parent, ahead), 400)
    assert AttestWithheld(parent, m.id) in other.handle(Tick(), 1_000)


def test_no_progress_report_is_sent_twice() -> None:
    n = Net.of([PUB.peer_id, *IDS], stripes=4)
    m = manifest_for(PUB, IDS, chunks=16)
    n.publish(PUB.peer_id, m)
    for peer in IDS:
        sent = [(e.peer, e.message) for p, e in n.log if p == peer and isinstance(e, Send)
                and isinstance(e.message, RelayProgress)]
        assert len(sent) == len(set(sent)), peer  # a repeat is a replay to its receiver
