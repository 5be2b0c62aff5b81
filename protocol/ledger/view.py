"""Read-only queries over the ledger state, for the task market and verification.

* ``find_peers(now, model=, family=, role=, ...)``: live peers that serve a model (by name or
  family, with a minimum context) and offer a role, sorted best first by a named key
  (``SORT_KEYS``) or any callable; ties break by peer id, so every node ranks alike.
* ``reputation(peer, now)``: protocol/ledger/reputation.py evaluated at ``now`` rounded down to
  ``REPUTATION_EPOCH_MS``, cached per peer and recomputed only when the epoch or the peer's
  attestations change (``LedgerState.subject_version``): cheap enough to call per bid.
* ``attestations(subject=, observer=, kind=)``, ``capability(peer)``, ``digest_hash(now)``.
* ``agents(peer, now)``: the node's live ``AgentCards`` record; ``agent_records(now)``: every
  live one (``HeldCards``, by node id). Whether a card's vector is its description's is the
  node's check (node/agents/checks.py); a record refused for it is no longer here.

Every ``now`` is the driver's clock; ``clock_offset_ms`` (the machine's) maps it to the Unix
epoch milliseconds records carry. Pure: no clock, no I/O; nothing here changes the state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from crypto.hashing import digest
from protocol.agents.cards import AgentCards
from protocol.codec import encode
from protocol.ledger.cards import HeldCards
from protocol.ledger.held import HeldAttestation
from protocol.ledger.records import AttestationKind, CapabilityRecord, ModelOffer, Role
from protocol.ledger.reputation import NEUTRAL, REPUTATION_EPOCH_MS, Reputation, reputation
from protocol.ledger.state import HeldRecord, LedgerState


@dataclass(frozen=True, slots=True)
class PeerMatch:
    peer_id: str
    record: CapabilityRecord
    #: the best offer matching the query's model/family/context (None if it named none)
    offer: ModelOffer | None
    reputation: Reputation
    #: when the peer's current record arrived (Unix epoch ms)
    last_seen_ms: int


def _best_tps(m: PeerMatch) -> float:
    if m.offer is not None:
        return m.offer.tokens_per_s
    return max((o.tokens_per_s for o in m.record.models), default=0.0)


#: sort keys for ``find_peers``: best first, ties broken by peer id
SORT_KEYS: dict[str, Callable[[PeerMatch], tuple[float, str]]] = {
    "reputation": lambda m: (-m.reputation.score, m.peer_id),
    "tokens_per_s": lambda m: (-_best_tps(m), m.peer_id),
    "price": lambda m: (m.record.price_per_1k_tokens, m.peer_id),
    "free_slots": lambda m: (-float(m.record.free_slots), m.peer_id),
    "load": lambda m: (m.record.load, m.peer_id),
}


class LedgerView:
    def __init__(self, state: LedgerState, own_peer_id: str, clock_offset_ms: int = 0) -> None:
        self.state = state
        self.own_peer_id = own_peer_id
        self.clock_offset_ms = clock_offset_ms
        self._cache: dict[str, tuple[int, int, Reputation]] = {}

    def capability(self, peer: str, now: int | None = None) -> HeldRecord | None:
        """The peer's newest record (None if unknown, or if expired when ``now`` is given)."""
        held = self.state.records.get(peer)
        if held is None or (now is not None and not held.live(now + self.clock_offset_ms)):
            return None
        return held

    def agents(self, peer: str, now: int | None = None) -> AgentCards | None:
        """The node's newest agent-card record (None if unknown, or expired at ``now``)."""
        held = self.state.cards.held.get(peer)
        if held is None or (now is not None and not held.live(now + self.clock_offset_ms)):
            return None
        return held.record

    def agent_records(self, now: int) -> list[HeldCards]:
        """Every node's live agent-card record, by node id."""
        return list(self.state.cards.live(now + self.clock_offset_ms))

    def reputation(self, peer: str, now: int) -> Reputation:
        return self._reputation(peer, now + self.clock_offset_ms)

    def _reputation(self, peer: str, epoch_ms: int) -> Reputation:
        epoch = epoch_ms - epoch_ms % REPUTATION_EPOCH_MS
        version = self.state.subject_version.get(peer, 0)
        if version == 0:
            return NEUTRAL
        cached = self._cache.get(peer)
        if cached is not None and cached[0] == epoch and cached[1] == version:
            return cached[2]
        atts = self.state.attestations
        triples = [(h, atts[h].observer, atts[h].attestation) for h in self.state.by_subject[peer]]
        rep = reputation(triples, peer, epoch)
        if len(self._cache) > 2 * max(1, len(self.state.by_subject)):
            self._cache.clear()  # drop entries of subjects that are gone
        self._cache[peer] = (epoch, version, rep)
        return rep

    def find_peers(
        self,
        now: int,
        *,
        model: str | None = None,
        family: str | None = None,
        role: Role | None = None,
        min_context: int = 0,
        need_free_slot: bool = False,
        sort_by: str | Callable[[PeerMatch], Any] = "reputation",
        include_self: bool = True,
    ) -> list[PeerMatch]:
        """Live peers serving ``model`` (or any model of ``family``) with ``role``, best first."""
        key = SORT_KEYS[sort_by] if isinstance(sort_by, str) else sort_by
        now += self.clock_offset_ms
        found: list[PeerMatch] = []
        for held in self.state.live_records(now):
            rec = held.record
            if not include_self and rec.peer_id == self.own_peer_id:
                continue
            if role is not None and role not in rec.roles:
                continue
            if need_free_slot and rec.free_slots == 0:
                continue
            offer: ModelOffer | None = None
            if model is not None or family is not None or min_context:
                offers = [
                    o
                    for o in rec.models
                    if (model is None or o.name == model)
                    and (family is None or o.family == family)
                    and o.context_length >= min_context
                ]
                if not offers:
                    continue
                offer = max(offers, key=lambda o: (o.tokens_per_s, o.name))
            found.append(
                PeerMatch(
                    peer_id=rec.peer_id,
                    record=rec,
                    offer=offer,
                    reputation=self._reputation(rec.peer_id, now),
                    last_seen_ms=held.received_at_ms,
                )
            )
        found.sort(key=key)
        return found

    def attestations(
        self,
        *,
        subject: str | None = None,
        observer: str | None = None,
        kind: AttestationKind | None = None,
    ) -> list[HeldAttestation]:
        """Held attestations, newest first (ties by hash)."""
        pool: Iterable[HeldAttestation]
        if subject is not None:
            pool = (self.state.attestations[h] for h in self.state.by_subject.get(subject, ()))
        else:
            pool = self.state.attestations.values()
        chosen = [
            a
            for a in pool
            if (observer is None or a.observer == observer)
            and (kind is None or a.attestation.kind is kind)
        ]
        chosen.sort(key=lambda a: (-a.attestation.observed_at_ms, a.hash))
        return chosen

    def digest_hash(self, now: int) -> bytes:
        """One hash of what this node holds: equal on two nodes iff they converged."""
        return digest(
            encode(self.state.digest(now + self.clock_offset_ms)), person=b"symphony-ledger"
        )
