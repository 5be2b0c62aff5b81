"""The merge is a CRDT: the same records in any order, with duplicates, give the same ledger.

A pool of signed items covers every merge rule: several seqs per peer, two records with one
seq (the larger hash must win), an observer over its per-minute quota (the smallest hashes must
stay), and invalid items. Hypothesis draws streams from the pool, permutes and duplicates them.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.ledger.machine import LedgerConfig, LedgerMachine
from protocol.machine import Received
from tests.protocol.ledger_net import NET, T0, Net, gossip, machine
from tests.protocol.ledger_pool import PEERS, POOL

CFG = LedgerConfig(observer_quota=3)


def _apply(m: LedgerMachine, stream: list[int]) -> None:
    for n, i in enumerate(stream):
        kind, env = POOL[i]
        push = gossip([env]) if kind == "r" else gossip(atts=[env])
        m.handle(Received(f"relay{n % 7}", push, "ledger"), T0)


def _state(m: LedgerMachine) -> tuple[object, ...]:
    return (
        m.view.digest_hash(T0),
        sorted((p, h.hash) for p, h in m.state.records.items()),
        sorted(m.state.attestations),
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_order_with_duplicates_gives_the_same_ledger(data: st.DataObject) -> None:
    picked = data.draw(
        st.lists(st.integers(0, len(POOL) - 1), max_size=len(POOL) * 2), label="stream"
    )
    dupes = data.draw(
        st.lists(st.sampled_from(picked), max_size=20) if picked else st.just([]), label="dupes"
    )
    shuffled = data.draw(st.permutations(picked + dupes), label="shuffled")
    once = sorted(set(picked))
    a, b, c = machine(1, CFG), machine(1, CFG), machine(1, CFG)
    _apply(a, picked)
    _apply(b, shuffled)
    _apply(c, once)
    assert _state(a) == _state(b) == _state(c)


@settings(max_examples=15, deadline=None)
@given(split=st.lists(st.integers(0, 2), min_size=len(POOL), max_size=len(POOL)))
def test_nodes_holding_parts_converge_by_anti_entropy_to_the_union(split: list[int]) -> None:
    net = Net()
    nodes = [net.add(machine(i, CFG)) for i in (1, 2, 3)]
    for i, holder in enumerate(split):
        _apply(nodes[holder], [i])
    reference = machine(9, CFG)
    _apply(reference, list(range(len(POOL))))
    net.connect(nodes[0].peer_id, nodes[1].peer_id)
    net.connect(nodes[1].peer_id, nodes[2].peer_id)
    net.run()
    net.advance(T0 + CFG.anti_entropy_ms)  # a periodic round closes the two-hop gap
    for m in nodes:
        assert _state(m) == _state(reference)


def test_pool_exercises_every_merge_rule() -> None:
    m = machine(1, CFG)
    _apply(m, list(range(len(POOL)))[::-1])  # newest seqs first: the older ones are replays
    reasons = {r for counts in m.rejections().values() for r in counts}
    assert {"seq_replay", "wrong_network"} <= reasons
    assert len(m.state.attestations) == 12 + 3
    assert len(m.state.records) == len(PEERS)
    assert all(h.record.network_id == NET for h in m.state.records.values())


def test_a_quota_of_one_keeps_each_minutes_smallest_hash_in_any_order() -> None:
    """A slot of one hash is held as is (no list): evicting it must leave the slot empty, so
    the next one is counted against the quota again."""
    one = LedgerConfig(observer_quota=1)
    forward, backward = machine(1, one), machine(1, one)
    order = list(range(len(POOL)))
    _apply(forward, order + order)
    _apply(backward, order[::-1])
    assert _state(forward) == _state(backward)
    slots: dict[tuple[str, int], list[bytes]] = {}
    for h, held in forward.state.attestations.items():
        key = (held.observer, held.attestation.observed_at_ms // 60_000)
        slots.setdefault(key, []).append(h)
    assert slots and all(len(hashes) == 1 for hashes in slots.values())
    three = machine(1, CFG)
    _apply(three, order)
    assert len(forward.state.attestations) < len(three.state.attestations)
