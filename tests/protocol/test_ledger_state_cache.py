"""LedgerState's cached views (lazy buckets, incremental summary, cached digest, the soonest
expiry) always equal what a from-scratch recomputation of the held items gives, whatever order
things happen in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.hashing import digest
from protocol.ledger.messages import BUCKETS, PREFIX_LEN
from protocol.ledger.state import LedgerState, bucket_summary_of
from protocol.machine import Received, Tick
from tests.protocol.ledger_net import MINUTE, T0, gossip, machine
from tests.protocol.ledger_pool import POOL


def _summary(state: LedgerState) -> bytes:
    if not state.attestations:
        return b""
    parts = []
    for b in range(BUCKETS):
        members = sorted(h for h in state.attestations if h[0] == b)
        parts.append(
            digest(b"".join(members), person=b"symphony-bucket")[:PREFIX_LEN]
            if members
            else bytes(PREFIX_LEN)
        )
    return b"".join(parts)


def _check(state: LedgerState, now: int) -> None:
    d = state.digest(now)
    live = sorted(p for p, h in state.records.items() if h.record.expires_at_ms > now)
    assert [rv.peer_id for rv in d.records] == live
    assert all(
        (rv.seq, rv.hash_prefix)
        == (state.records[rv.peer_id].record.seq, state.records[rv.peer_id].hash[:PREFIX_LEN])
        for rv in d.records
    )
    assert d.attestation_count == len(state.attestations)
    # (held attestations not yet in their heap count as if they were: they are pushed lazily)
    heads = [h[0][0] for h in (state._expiry, state._record_expiry, state.cards.expiry) if h]
    heads += [held.attestation.expires_at_ms for held in state.attestations.values()]
    assert state.next_expiry() == (min(heads) if heads else None)
    assert d.attestation_buckets == state.bucket_summary() == _summary(state)
    for b in {h[0] for h in state.attestations} | {0, 255}:
        assert list(state.bucket(b)) == sorted(h for h in state.attestations if h[0] == b)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(0, len(POOL) - 1)),
            st.tuples(st.just("read"), st.integers(0, 3)),
            st.tuples(st.just("tick"), st.integers(1, 30)),
        ),
        max_size=60,
    )
)
def test_cached_views_match_a_recomputation(steps: list[tuple[str, int]]) -> None:
    m = machine(1)
    now = T0
    for kind, arg in steps:
        if kind == "push":
            what, env = POOL[arg]
            push = gossip([env]) if what == "r" else gossip(atts=[env])
            m.handle(Received("relay", push, "ledger"), now)
        elif kind == "tick":
            now += arg * MINUTE  # records expire (15 min), then leave (tombstones)
            m.handle(Tick(), now)
        else:
            _check(m.state, now + arg)  # reading twice in a row hits the caches
            _check(m.state, now + arg)
    _check(m.state, now)


def test_many_merges_between_reads_are_sorted_in_at_once() -> None:
    m = machine(1)
    atts = [env for what, env in POOL if what == "a"]
    assert len(atts) > 16  # more than are put in place one by one
    m.handle(Received("relay", gossip(atts=atts), "ledger"), T0)
    _check(m.state, T0)
    assert m.stats["items_accepted"] == len(m.state.attestations)


def test_summary_made_anew_and_bucket_by_bucket_agree() -> None:
    """Many buckets changed at once: the summary is made from all hashes in one call
    (``bucket_summary_of``); then one more: bucket by bucket. Both equal a recomputation."""
    atts = [env for what, env in POOL if what == "a"]
    m = machine(1)
    m.handle(Received("relay", gossip(atts=atts[:-1]), "ledger"), T0)
    assert len({h[0] for h in m.state.attestations}) >= 16  # enough buckets to go the one way
    assert m.state.bucket_summary() == _summary(m.state)
    m.handle(Received("relay", gossip(atts=atts[-1:]), "ledger"), T0)
    assert m.state.bucket_summary() == _summary(m.state)
    assert bucket_summary_of(tuple(sorted(m.state.attestations))) == _summary(m.state)
    assert bucket_summary_of(()) == bytes(BUCKETS * PREFIX_LEN)
