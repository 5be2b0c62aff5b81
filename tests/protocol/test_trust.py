"""Earned reputation (protocol.ledger.trust): trust seeded by the requester's own observations,
checked against hand math, and the clique attack it answers."""

from __future__ import annotations

import itertools
import random

import pytest

from protocol.ledger.records import Attestation, AttestationKind
from protocol.ledger.trust import (
    MIN_OVERLAP,
    Verdicts,
    observer_trust,
    praise_groups,
    standings,
    verdicts,
)

K = AttestationKind
T0 = 1_000_000_000
DAY = 24 * 60 * 60 * 1000


def att(subject: str, kind: AttestationKind, n: int, at: int = T0) -> Attestation:
    return Attestation(network_id="t", subject=subject, object_id=bytes([n % 256, n // 256]),
                       kind=kind, outcome="", evidence_hash=b"", amount=0, observed_at_ms=at,
                       expires_at_ms=at + 30 * DAY)


def triples(*specs: tuple[str, str, AttestationKind, int]) -> list[tuple[bytes, str, Attestation]]:
    """(observer, subject, kind, how many) -> (hash, observer, attestation) triples."""
    out = []
    n = 0
    for observer, subject, kind, count in specs:
        for _ in range(count):
            n += 1
            out.append((n.to_bytes(4, "big"), observer, att(subject, kind, n)))
    return out


def records(*specs: tuple[str, str, AttestationKind, int]) -> dict[str, float]:
    v = verdicts(triples(*specs), T0)
    return {s: st.record for s, st in standings(v, observer_trust(v, "me")).items()}


def test_own_observations_count_fully_and_nothing_else_is_assumed() -> None:
    got = records(("me", "e", K.TASK_COMPLETED, 3), ("me", "f", K.TASK_FAILED, 2))
    assert got["e"] == pytest.approx((1 + 3) / (2 + 3))
    assert got["f"] == pytest.approx(1 / (2 + 2))
    assert "g" not in got  # unseen: the market reads 0.5


def test_a_clique_praising_itself_earns_nothing() -> None:
    clique = ["s1", "s2", "s3", "s4"]
    praise = [(a, b, K.TASK_COMPLETED, 5) for a, b in itertools.permutations(clique, 2)]
    got = records(*praise, ("me", "e", K.TASK_COMPLETED, 2))
    assert all(got.get(s, 0.5) == 0.5 for s in clique)
    v = verdicts(triples(*praise), T0)
    assert observer_trust(v, "me") == {"me": 1.0}


def test_praise_against_the_requesters_own_verdict_is_not_believed() -> None:
    got = records(("me", "s1", K.TASK_FAILED, 3),
                  ("s2", "s1", K.TASK_COMPLETED, 5), ("s3", "s1", K.TASK_COMPLETED, 5))
    assert got["s1"] == pytest.approx(1 / (2 + 3))


def test_an_observer_that_agrees_with_the_requester_is_trusted_in_part() -> None:
    specs = [("me", "e1", K.TASK_COMPLETED, 4), ("me", "e2", K.TASK_FAILED, 4),
             ("r2", "e1", K.TASK_COMPLETED, 4), ("r2", "e2", K.TASK_FAILED, 4),
             ("r2", "e3", K.TASK_COMPLETED, 4)]
    v = verdicts(triples(*specs), T0)
    trust = observer_trust(v, "me")
    # agreement: both sides rate e1 5/6 and e2 1/6, on 8 shared units of evidence
    assert trust["r2"] == pytest.approx(8 / (8 + MIN_OVERLAP))
    e3 = standings(v, trust)["e3"]
    assert e3.successes == pytest.approx(4 * trust["r2"])
    assert 0.5 < e3.record < (1 + 4) / (2 + 4)  # counts, but less than the requester's own


def test_trust_spreads_only_through_agreeing_observers() -> None:
    # r3 agrees with r2 on e3 only, which the requester never saw: r3 is trusted through r2
    specs = [("me", "e1", K.TASK_COMPLETED, 4), ("r2", "e1", K.TASK_COMPLETED, 4),
             ("r2", "e3", K.TASK_COMPLETED, 4), ("r3", "e3", K.TASK_COMPLETED, 4),
             ("r3", "e4", K.TASK_COMPLETED, 4), ("x", "e9", K.TASK_COMPLETED, 4)]
    trust = observer_trust(verdicts(triples(*specs), T0), "me")
    assert 0 < trust["r3"] < trust["r2"] < 1.0
    assert "x" not in trust


def test_praise_groups_need_praise_both_ways() -> None:
    v: Verdicts = {"a": {"b": (3.0, 0.0)}, "b": {"a": (2.0, 0.0), "c": (5.0, 0.0)},
                   "c": {"d": (1.0, 0.0)}, "d": {"c": (0.0, 2.0)}}
    groups = praise_groups(v)
    assert groups == {"a": "a", "b": "a"}


def test_order_does_not_change_a_single_bit() -> None:
    specs = triples(("me", "e1", K.TASK_COMPLETED, 3), ("me", "e2", K.TASK_FAILED, 2),
                    ("r2", "e1", K.TASK_COMPLETED, 2), ("r2", "e3", K.VERIFICATION_FAILED, 1),
                    ("s1", "s2", K.TASK_COMPLETED, 5), ("s2", "s1", K.TASK_COMPLETED, 5))
    first = verdicts(specs, T0)
    rng = random.Random(7)
    for _ in range(5):
        shuffled = list(specs)
        rng.shuffle(shuffled)
        v = verdicts(shuffled, T0)
        assert v == first
        assert standings(v, observer_trust(v, "me")) == standings(first,
                                                                  observer_trust(first, "me"))


def test_expired_and_self_attestations_are_dropped() -> None:
    specs = triples(("me", "me", K.TASK_COMPLETED, 3), ("e", "e", K.TASK_COMPLETED, 3))
    old = [(b"\xff" * 4, "me", att("e", K.TASK_COMPLETED, 99, at=T0 - 40 * DAY))]
    assert verdicts(specs + old, T0) == {}
