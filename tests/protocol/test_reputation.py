"""Reputation is the documented function of (attestations, now): checked against hand math."""

from __future__ import annotations

import random

import pytest

from protocol.codec import decode
from protocol.ledger.records import Attestation, AttestationKind
from protocol.ledger.reputation import (
    HALF_LIFE_MS,
    NEUTRAL,
    OBSERVER_SUCCESS_CAP,
    Reputation,
    reputation,
)
from tests.protocol.ledger_net import HOUR, T0, attestation, identity

S = identity(1)
K = AttestationKind


def _triples(*specs: tuple[int, AttestationKind, int]) -> list[tuple[bytes, str, Attestation]]:
    """(observer index, kind, observed_at) -> (hash, observer, attestation)."""
    out = []
    for n, (obs, kind, at) in enumerate(specs):
        env = attestation(
            identity(obs), S.peer_id, kind=kind, now=at, ttl=30 * 24 * HOUR, object_id=bytes([n])
        )
        out.append((env.content_hash, identity(obs).peer_id, decode(env.payload, Attestation)))
    return out


def _rep(*specs: tuple[int, AttestationKind, int], now: int = T0) -> Reputation:
    return reputation(_triples(*specs), S.peer_id, now)


def test_no_evidence_is_neutral() -> None:
    assert _rep() == NEUTRAL and NEUTRAL.score == 0.5


def test_beta_estimate_by_hand() -> None:
    r = _rep((10, K.TASK_COMPLETED, T0), (11, K.TASK_COMPLETED, T0), (12, K.TASK_FAILED, T0))
    assert r.score == pytest.approx((1 + 2) / (2 + 3))
    assert (r.successes, r.failures, r.observers, r.evidence) == (2.0, 1.0, 3, 3)


def test_a_failed_verification_outweighs_many_completed_tasks() -> None:
    good = [(10 + i, K.TASK_COMPLETED, T0) for i in range(9)]
    r = _rep(*good, (50, K.VERIFICATION_FAILED, T0))
    assert r.score == pytest.approx((1 + 9) / (2 + 9 + 10)) and r.score < 0.5


def test_evidence_halves_every_half_life() -> None:
    fresh = _rep((10, K.TASK_FAILED, T0))
    old = _rep((10, K.TASK_FAILED, T0 - HALF_LIFE_MS))
    assert fresh.failures == 1.0 and old.failures == pytest.approx(0.5)
    assert old.score > fresh.score
    future = _rep((10, K.TASK_FAILED, T0 + 1000))
    assert future.failures == 1.0  # future-dated evidence counts as new, never more


def test_one_observer_can_vouch_only_so_much() -> None:
    flood = [(10, K.VERIFICATION_PASSED, T0) for _ in range(50)]
    r = _rep(*flood)
    assert r.successes == OBSERVER_SUCCESS_CAP and r.observers == 1
    many = _rep(*[(10 + i, K.VERIFICATION_PASSED, T0) for i in range(10)])
    assert many.score > r.score


def test_expired_self_and_other_subjects_are_ignored() -> None:
    triples = _triples((10, K.TASK_FAILED, T0))
    expired_env = attestation(
        identity(11), S.peer_id, kind=K.TASK_FAILED, now=T0 - 2 * HOUR, ttl=HOUR
    )
    triples.append(
        (expired_env.content_hash, identity(11).peer_id, decode(expired_env.payload, Attestation))
    )
    other = attestation(identity(12), identity(2).peer_id, kind=K.TASK_FAILED)
    triples.append((other.content_hash, identity(12).peer_id, decode(other.payload, Attestation)))
    self_claim = _triples((1, K.TASK_COMPLETED, T0))  # observer 1 is S itself
    r = reputation(triples + self_claim, S.peer_id, T0)
    assert r.evidence == 1 and r.failures == 1.0


def test_order_does_not_change_a_single_bit() -> None:
    rng = random.Random(7)
    kinds = list(K)
    specs = [
        (10 + rng.randrange(20), rng.choice(kinds), T0 - rng.randrange(10**9)) for _ in range(200)
    ]
    triples = _triples(*specs)
    first = reputation(triples, S.peer_id, T0)
    for _ in range(5):
        rng.shuffle(triples)
        assert reputation(triples, S.peer_id, T0) == first
