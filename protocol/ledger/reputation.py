"""Reputation: a documented, deterministic function of attestations and time.

Reputation is never gossiped; every node derives it from the attestations it holds, so two
nodes holding the same attestations compute the same number at the same ``now_ms``.

The function (Beta-style)
-------------------------
For subject ``s`` at time ``now``, take every attestation about ``s`` that has not expired,
whose observer is not ``s``. Each contributes to a success mass or a failure mass::

    w = KIND_WEIGHTS[kind] * 0.5 ** (max(0, now - observed_at) / HALF_LIFE_MS)

Per observer, the success mass is capped at ``OBSERVER_SUCCESS_CAP`` and the failure mass at
``OBSERVER_FAILURE_CAP``: one identity can vouch for (or slander) a peer only so much, so
inflating a reputation takes many observers that are themselves on record. Then::

    S = sum over observers of capped success,   F = likewise for failures
    score = (PRIOR_SUCCESS + S) / (PRIOR_SUCCESS + PRIOR_FAILURE + S + F)

A peer nobody has attested scores 0.5. A failed verification (weight 10) outweighs ten
completed tasks; evidence halves in weight every ``HALF_LIFE_MS`` (7 days), so a peer recovers
slowly from old failures and cannot live on old successes.

Determinism: sums are ``math.fsum`` (exactly rounded, so independent of order) over
attestations sorted by content hash. The machine (protocol/ledger/machine.py) evaluates the function at
``now`` rounded down to ``REPUTATION_EPOCH_MS``, which makes it cacheable per peer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.ledger.records import Attestation, AttestationKind

HALF_LIFE_MS = 7 * 24 * 60 * 60 * 1000
PRIOR_SUCCESS = 1.0
PRIOR_FAILURE = 1.0
OBSERVER_SUCCESS_CAP = 5.0
OBSERVER_FAILURE_CAP = 20.0
#: the machine evaluates reputation at now // REPUTATION_EPOCH_MS * REPUTATION_EPOCH_MS
REPUTATION_EPOCH_MS = 60 * 1000

#: kind -> (success weight, failure weight)
KIND_WEIGHTS: dict[AttestationKind, tuple[float, float]] = {
    AttestationKind.TASK_COMPLETED: (1.0, 0.0),
    AttestationKind.TASK_FAILED: (0.0, 1.0),
    AttestationKind.TASK_TIMED_OUT: (0.0, 0.5),
    AttestationKind.VERIFICATION_PASSED: (2.0, 0.0),
    AttestationKind.VERIFICATION_FAILED: (0.0, 10.0),
    AttestationKind.RELAY_SERVED: (0.25, 0.0),
    AttestationKind.VERDICT_CONTRADICTED: (0.0, 5.0),
    # a corrupt chunk is never an accident of the network (chunks are hash-checked end to
    # end), so it weighs like a failed verification
    AttestationKind.RELAY_BAD_CHUNK: (0.0, 10.0),
    # a parent that stalled its children: a free rider, or a link that failed mid-transfer
    AttestationKind.RELAY_WITHHELD: (0.0, 1.0),
}


@dataclass(frozen=True, slots=True)
class Reputation:
    #: in (0, 1); 0.5 for a peer with no evidence
    score: float
    #: capped, decayed success and failure masses (S and F above)
    successes: float
    failures: float
    #: distinct observers with live evidence
    observers: int
    #: live attestations counted
    evidence: int


NEUTRAL = Reputation(
    score=PRIOR_SUCCESS / (PRIOR_SUCCESS + PRIOR_FAILURE),
    successes=0.0,
    failures=0.0,
    observers=0,
    evidence=0,
)


def decay(age_ms: int) -> float:
    """Weight of evidence ``age_ms`` old (future-dated evidence counts as new)."""
    return float(0.5 ** (max(0, age_ms) / HALF_LIFE_MS))


def reputation(
    attested: Iterable[tuple[bytes, str, Attestation]], subject: str, now_ms: int
) -> Reputation:
    """Reputation of ``subject`` from ``(content_hash, observer, attestation)`` triples.

    Triples about other subjects, expired ones and self-attestations are ignored, so a caller
    may pass a superset.
    """
    per_observer: dict[str, tuple[list[float], list[float]]] = {}
    evidence = 0
    for _h, observer, att in sorted(attested, key=lambda t: t[0]):
        if att.subject != subject or observer == subject or att.expires_at_ms <= now_ms:
            continue
        good, bad = KIND_WEIGHTS[att.kind]
        w = decay(now_ms - att.observed_at_ms)
        masses = per_observer.setdefault(observer, ([], []))
        masses[0].append(good * w)
        masses[1].append(bad * w)
        evidence += 1
    if not evidence:
        return NEUTRAL
    successes = math.fsum(
        min(math.fsum(per_observer[o][0]), OBSERVER_SUCCESS_CAP) for o in sorted(per_observer)
    )
    failures = math.fsum(
        min(math.fsum(per_observer[o][1]), OBSERVER_FAILURE_CAP) for o in sorted(per_observer)
    )
    score = (PRIOR_SUCCESS + successes) / (PRIOR_SUCCESS + PRIOR_FAILURE + successes + failures)
    return Reputation(
        score=score,
        successes=successes,
        failures=failures,
        observers=len(per_observer),
        evidence=evidence,
    )
