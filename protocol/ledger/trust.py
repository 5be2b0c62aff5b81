"""Earned reputation: a peer's track record as one requester trusts it.

The attack it answers
---------------------
``protocol.ledger.reputation`` counts every observer alike (up to a cap each). A coalition of
identities that attest each other's "completed tasks" therefore manufactures reputation out of
nothing, and the vote weighs that reputation (measured by the voting scenario: such a clique
pulled k = 7 weighted voting below a plain majority). Reputation must be earned from observers
the requester has reason to believe.

The rule (pure and deterministic: a function of the held attestations, the requester's own
peer id and ``now``)
-------------------------------------------------------------------------------------------
1. *Verdicts.* For every observer ``o`` and subject ``s != o``: the success and failure masses
   of ``o``'s live attestations about ``s``, with the weights, decay and per-observer caps of
   ``protocol.ledger.reputation`` (``KIND_WEIGHTS``, ``decay``); one observer's mass about
   one subject is scaled down as a whole to at most ``OBSERVER_EVIDENCE_CAP``, keeping its rate.
2. *Observer trust, seeded by the requester's own observations* (in the spirit of
   EigenTrust's pre-trusted peers): the requester trusts itself fully (``t = 1``); every other
   observer starts at 0. Each of ``TRUST_ROUNDS`` rounds forms the trust-weighted consensus
   rate of every subject, ``(1 + sum t*S) / (2 + sum t*(S + F))``, and re-rates each other
   observer by how its own smoothed rates agree with that consensus (its own verdicts left
   out), subject by subject, weighted by the evidence both sides hold::

       agreement = sum_s w_s * (1 - AGREEMENT_SLOPE * |rate_o(s) - consensus(s)|) / sum_s w_s
       t_o       = max(0, agreement) * W / (W + MIN_OVERLAP),   W = sum_s w_s

   Trust thus flows from the requester to observers whose verdicts agree with verdicts it
   already trusts, and no further. An observer that speaks only about subjects nobody trusted
   has observed (a clique praising itself) earns ``t = 0``: reputation that flows only inside
   a clique never counts, however many identities the clique has.
3. *Track record.* ``record(s) = (1 + sum_o t_o * S_os) / (2 + sum_o t_o * (S_os + F_os))``,
   in (0, 1), 0.5 for a peer no trusted observer has seen. This is what the task market uses
   as an executor's reputation: for selection and as the cap on the confidence a ballot may
   claim (``protocol.market.voting``).
4. *Praise groups.* Two peers that each hold a net-positive verdict about the other (more
   success than failure mass) are linked; a connected set of linked peers is one group,
   named by its smallest peer id. Selection prefers executors of distinct groups
   (``protocol.market.selection``): identities that vouch for each other are likely one
   operator.

``TrustView`` evaluates the rule over a ``LedgerView`` at ``now`` rounded down to
``REPUTATION_EPOCH_MS`` and caches it until the epoch or the held attestations change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.ledger.records import Attestation
from protocol.ledger.reputation import KIND_WEIGHTS, REPUTATION_EPOCH_MS, decay
from protocol.ledger.view import LedgerView

#: rounds of re-rating observers against the trusted consensus (trust spreads one hop a round)
TRUST_ROUNDS = 3
#: a rate gap of 1 / AGREEMENT_SLOPE between an observer and the consensus counts as no agreement
AGREEMENT_SLOPE = 2.0
#: shared evidence mass at which an agreeing observer earns half of full trust
MIN_OVERLAP = 4.0
#: one observer's evidence about one subject counts up to this mass, scaled down as a whole so
#: that its success rate is kept (a trusted requester's long record stays a rate, not a count)
OBSERVER_EVIDENCE_CAP = 20.0

#: observer -> subject -> (success mass, failure mass)
Verdicts = dict[str, dict[str, tuple[float, float]]]


@dataclass(frozen=True, slots=True)
class Standing:
    #: trust-weighted track record in (0, 1); 0.5 when no trusted observer has seen the peer
    record: float
    #: the trusted success and failure masses behind it
    successes: float
    failures: float
    #: the peer's praise group (its own id when it belongs to none)
    group: str


def verdicts(attested: Iterable[tuple[bytes, str, Attestation]], now_ms: int) -> Verdicts:
    """Capped, decayed masses per observer and subject from ``(hash, observer, att)`` triples;
    expired and self-attestations are dropped."""
    raw: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for _h, observer, att in sorted(attested, key=lambda t: t[0]):
        if observer == att.subject or att.expires_at_ms <= now_ms:
            continue
        good, bad = KIND_WEIGHTS[att.kind]
        w = decay(now_ms - att.observed_at_ms)
        masses = raw.setdefault(observer, {}).setdefault(att.subject, ([], []))
        masses[0].append(good * w)
        masses[1].append(bad * w)
    return {
        o: {s: _capped(math.fsum(g), math.fsum(b)) for s, (g, b) in sorted(subjects.items())}
        for o, subjects in sorted(raw.items())
    }


def _capped(successes: float, failures: float) -> tuple[float, float]:
    total = successes + failures
    if total <= OBSERVER_EVIDENCE_CAP:
        return successes, failures
    scale = OBSERVER_EVIDENCE_CAP / total
    return successes * scale, failures * scale


def _rate(successes: float, failures: float) -> float:
    return (1.0 + successes) / (2.0 + successes + failures)


def _consensus(v: Verdicts, trust: dict[str, float]) -> dict[str, tuple[float, float]]:
    sums: dict[str, tuple[list[float], list[float]]] = {}
    for o in sorted(trust):
        t = trust[o]
        for s, (good, bad) in v.get(o, {}).items():
            acc = sums.setdefault(s, ([], []))
            acc[0].append(t * good)
            acc[1].append(t * bad)
    return {s: (math.fsum(g), math.fsum(b)) for s, (g, b) in sums.items()}


def _agreement(mine: dict[str, tuple[float, float]], t_self: float,
               consensus: dict[str, tuple[float, float]]) -> float:
    """Trust earned by an observer with verdicts ``mine`` (held with trust ``t_self``)."""
    scores: list[float] = []
    weights: list[float] = []
    for s, (good, bad) in mine.items():
        c_good, c_bad = consensus.get(s, (0.0, 0.0))
        c_good -= t_self * good  # leave the observer's own verdict out
        c_bad -= t_self * bad
        shared = min(good + bad, c_good + c_bad)
        if shared <= 1e-12:
            continue
        gap = abs(_rate(good, bad) - _rate(max(0.0, c_good), max(0.0, c_bad)))
        scores.append(shared * (1.0 - AGREEMENT_SLOPE * gap))
        weights.append(shared)
    if not weights:
        return 0.0
    w = math.fsum(weights)
    return max(0.0, math.fsum(scores) / w) * w / (w + MIN_OVERLAP)


def observer_trust(v: Verdicts, own: str) -> dict[str, float]:
    """Each observer's trust (rule step 2); observers earning none are left out."""
    trust = {own: 1.0}
    for _ in range(TRUST_ROUNDS):
        consensus = _consensus(v, trust)
        nxt = {own: 1.0}
        for o in sorted(v):
            if o != own:
                t = _agreement(v[o], trust.get(o, 0.0), consensus)
                if t > 0.0:
                    nxt[o] = t
        trust = nxt
    return trust


def praise_groups(v: Verdicts) -> dict[str, str]:
    """Peer -> its group's name, for peers linked by mutual net-positive verdicts."""
    parent: dict[str, str] = {}

    def root(p: str) -> str:
        while parent.get(p, p) != p:
            p = parent[p]
        return p

    for o in sorted(v):
        for s, (good, bad) in v[o].items():
            back = v.get(s, {}).get(o)
            if good > bad and back is not None and back[0] > back[1]:
                a, b = root(o), root(s)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return {p: root(p) for p in parent} | {r: r for r in set(parent.values())}


def standings(v: Verdicts, trust: dict[str, float]) -> dict[str, Standing]:
    """Every observed subject's standing under observer ``trust`` (rule steps 3 and 4)."""
    masses = _consensus(v, trust)
    groups = praise_groups(v)
    return {
        s: Standing(_rate(good, bad), good, bad, groups.get(s, s))
        for s, (good, bad) in sorted(masses.items())
    } | {
        p: Standing(0.5, 0.0, 0.0, g) for p, g in groups.items() if p not in masses
    }


class TrustView:
    """The rule over a ledger view, cached per reputation epoch and ledger change."""

    def __init__(self, view: LedgerView) -> None:
        self.view = view
        self._key: tuple[int, int] | None = None
        self._standings: dict[str, Standing] = {}
        self._trust: dict[str, float] = {}

    def _refresh(self, now: int) -> dict[str, Standing]:
        at = now + self.view.clock_offset_ms
        epoch = at - at % REPUTATION_EPOCH_MS
        state = self.view.state
        key = (epoch, max(state.subject_version.values(), default=0))
        if key != self._key:
            atts = state.attestations
            held = [(h, a.observer, a.attestation) for h, a in sorted(atts.items())]
            v = verdicts(held, epoch)
            self._trust = observer_trust(v, self.view.own_peer_id)
            self._standings = standings(v, self._trust)
            self._key = key
        return self._standings

    def standing(self, peer: str, now: int) -> Standing:
        return self._refresh(now).get(peer) or Standing(0.5, 0.0, 0.0, peer)

    def record(self, peer: str, now: int) -> float:
        return self.standing(peer, now).record

    def group(self, peer: str, now: int) -> str:
        return self.standing(peer, now).group

    def trust(self, observer: str, now: int) -> float:
        """How far the requester trusts ``observer``'s attestations (0 when not at all)."""
        self._refresh(now)
        return self._trust.get(observer, 0.0)
