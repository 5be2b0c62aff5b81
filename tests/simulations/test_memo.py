"""Shared pure functions (simulations/memo.py): machines built with one SharedResults hold the
very same immutable per-item tuples and plans, equal to what each would make itself; machines
built without it share nothing; and a forgery is refused by every node, however many share."""

from __future__ import annotations

import random

from crypto.envelope import Envelope
from protocol.ledger.machine import LedgerMachine
from protocol.ledger.state import LedgerState
from protocol.machine import Memo, Received, no_memo
from protocol.relay.events import VersionPrepared
from protocol.relay.machine import RelayMachine
from simulations.memo import SharedResults
from tests.protocol.ledger_net import NET, T0, gossip, identity
from tests.protocol.ledger_pool import POOL
from tests.protocol.relay_net import identity as relay_identity
from tests.protocol.relay_net import manifest_for

ATTESTATIONS = [env for what, env in POOL if what == "a"][:5]


def _ledger(i: int, memo: Memo) -> LedgerMachine:
    return LedgerMachine(identity(i), NET, random.Random(i), memo=memo)


def _held(state: LedgerState) -> list[object]:
    return [state.attestations[h] for h in sorted(state.attestations)]


def test_ledgers_given_one_memo_share_the_tuples_they_hold_and_others_do_not() -> None:
    memo = SharedResults()
    a, b = _ledger(1, memo), _ledger(2, memo)
    c, d = _ledger(3, no_memo), _ledger(4, no_memo)
    for m in (a, b, c, d):
        m.handle(Received("relay", gossip(atts=ATTESTATIONS), "ledger"), T0)
    assert len(_held(a.state)) == len(ATTESTATIONS)
    assert _held(a.state) == _held(b.state) == _held(c.state) == _held(d.state)
    assert all(x is y for x, y in zip(_held(a.state), _held(b.state), strict=True))
    a.state.prune(T0), b.state.prune(T0)  # (expiry entries are pushed when first needed)
    assert len(a.state._expiry) == len(ATTESTATIONS)
    assert all(x is y for x, y in zip(a.state._expiry, b.state._expiry, strict=True))
    assert not any(x is y for x, y in zip(_held(c.state), _held(d.state), strict=True))
    # the observer quota's slots alike: keys whatever the arrival order, sorted hashes when
    # they arrived in the same order (a slot is made from the one before)
    assert a.state._quota == c.state._quota and len(a.state._quota) < len(ATTESTATIONS)
    e = _ledger(5, memo)
    e.handle(Received("relay", gossip(atts=ATTESTATIONS[::-1]), "ledger"), T0)
    assert e.state._quota == a.state._quota
    for key, slot in a.state._quota.items():
        assert next(k for k in e.state._quota if k == key) is key
        assert next(k for k in b.state._quota if k == key) is key and b.state._quota[key] is slot


def test_an_equal_item_in_other_objects_is_held_as_its_own_values() -> None:
    memo = SharedResults()
    a, b = _ledger(1, memo), _ledger(2, memo)
    a.handle(Received("relay", gossip(atts=ATTESTATIONS), "ledger"), T0)
    # b's copy of the same items decoded from bytes: other objects, equal values
    copies = [Envelope.decode(env.encode()) for env in ATTESTATIONS]
    b.handle(Received("relay", gossip(atts=copies), "ledger"), T0)
    assert _held(a.state) == _held(b.state)
    # b holds its own envelopes, not a's (a tuple is shared only when its parts are)
    assert {id(h.envelope) for h in _held(b.state)} == {id(env) for env in copies}


def test_a_forgery_is_refused_by_every_node_that_shares_the_memo() -> None:
    memo = SharedResults()
    real = ATTESTATIONS[0]
    forged = Envelope(public_key=real.public_key, domain=real.domain, payload=real.payload,
                      signature=bytes(64))
    nodes = [_ledger(i, memo) for i in range(1, 4)]
    for m in nodes:
        m.handle(Received("relay", gossip(atts=[forged]), "ledger"), T0)
        assert not m.state.attestations
        assert m.rejections() == {"relay": {"bad_signature": 1}}
    for m in nodes:  # the real one, whose bytes the forgery shares but for the signature
        m.handle(Received("relay", gossip(atts=[real]), "ledger"), T0)
        assert list(m.state.attestations) == [real.content_hash]


def test_relays_given_one_memo_share_the_checked_manifest_plan_and_chunk_index() -> None:
    publisher = relay_identity(1)
    ids = [relay_identity(n).peer_id for n in range(2, 5)]
    m = manifest_for(publisher, ids)
    memo = SharedResults()
    shared = [RelayMachine(p, memo=memo) for p in ids[:2]]
    alone = [RelayMachine(p) for p in ids[:2]]
    for relay in shared + alone:
        relay.handle(Received(publisher.peer_id, m.message, "relay"), 0)
        relay.handle(VersionPrepared(m.id, frozenset()), 0)
    one, two = (r.transfers[m.id] for r in shared)
    three, four = (r.transfers[m.id] for r in alone)
    assert one.plan == three.plan and one.by_hash == three.by_hash
    assert one.manifest is two.manifest and three.manifest is not four.manifest
    assert one.plan is two.plan and one.by_hash is two.by_hash
    assert three.plan is not four.plan and three.by_hash is not four.by_hash
