"""Shared pure functions: every node gets the very same immutable per-item tuples, equal to
what it would make itself, and nothing is shared outside the context."""

from __future__ import annotations

from protocol.ledger.state import LedgerState
from protocol.machine import Received
from simulations.memo import shared_pure_functions
from tests.protocol.ledger_net import T0, gossip, machine
from tests.protocol.ledger_pool import POOL

ATTESTATIONS = [env for what, env in POOL if what == "a"][:5]


def _held(state: LedgerState) -> list[object]:
    return [state.attestations[h] for h in sorted(state.attestations)]


def test_nodes_share_the_tuples_they_hold_inside_the_context_only() -> None:
    with shared_pure_functions():
        a, b = machine(1), machine(2)
        for m in (a, b):
            m.handle(Received("relay", gossip(atts=ATTESTATIONS), "ledger"), T0)
        assert _held(a.state) == _held(b.state)
        assert all(x is y for x, y in zip(_held(a.state), _held(b.state), strict=True))
        assert all(x is y for x, y in zip(a.state._expiry, b.state._expiry, strict=True))
    c, d = machine(3), machine(4)
    for m in (c, d):
        m.handle(Received("relay", gossip(atts=ATTESTATIONS), "ledger"), T0)
    assert _held(c.state) == _held(a.state)  # the same values, made apart
    assert not any(x is y for x, y in zip(_held(c.state), _held(d.state), strict=True))


def test_an_equal_item_in_other_objects_is_held_as_its_own_values() -> None:
    with shared_pure_functions():
        a, b = machine(1), machine(2)
        a.handle(Received("relay", gossip(atts=ATTESTATIONS), "ledger"), T0)
        # b's copy of the same items decoded from bytes: other objects, equal values
        copies = [type(env).decode(env.encode()) for env in ATTESTATIONS]
        b.handle(Received("relay", gossip(atts=copies), "ledger"), T0)
        assert _held(a.state) == _held(b.state)
        # b holds its own envelopes, not a's (a tuple is shared only when its parts are)
        assert {id(h.envelope) for h in _held(b.state)} == {id(env) for env in copies}
