"""Restoring a ledger from stored envelopes at start-up (sans-IO; the machine calls it).

Every stored envelope (the bytes as received) is checked again as a pushed one would be, at
``now``, and merged into the state; nothing is trusted because it was stored. Whatever no
longer passes (expired, corrupt) is reported by its stored bytes, and what the observer quota
evicted by content hash, so the store can delete them. No effects are produced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from crypto.envelope import Envelope, EnvelopeError
from protocol.ledger.intake import LedgerIntake
from protocol.ledger.records import Rejected
from protocol.ledger.state import LedgerState


@dataclass(slots=True)
class RestoreReport:
    records: int = 0
    attestations: int = 0
    agents: int = 0
    #: stored envelope bytes that no longer pass
    stale_records: list[bytes] = field(default_factory=list)
    stale_attestations: list[bytes] = field(default_factory=list)
    stale_agents: list[bytes] = field(default_factory=list)
    #: content hashes of attestations the observer quota evicted
    evicted: list[bytes] = field(default_factory=list)
    #: the highest seq of this node's own capability / agent-card records found (0: none)
    own_seq: int = 0
    own_cards_seq: int = 0


def restore_envelopes(
    state: LedgerState,
    intake: LedgerIntake,
    own_peer_id: str,
    records: Iterable[bytes],
    attestations: Iterable[bytes],
    agents: Iterable[bytes],
    now: int,
) -> RestoreReport:
    """Check and merge stored envelopes into ``state`` (``now``: Unix epoch ms)."""
    report = RestoreReport()
    for data in records:
        try:
            env = Envelope.decode(data)
            rec = intake.open_record(env, now)
            state.merge_record(env, rec, env.content_hash, now)
        except (EnvelopeError, Rejected):
            report.stale_records.append(data)
            continue
        report.records += 1
        if rec.peer_id == own_peer_id:
            report.own_seq = max(report.own_seq, rec.seq)
    for data in attestations:
        try:
            env = Envelope.decode(data)
            att = intake.open_attestation(env, now)
            h = env.content_hash
            _, evicted = state.merge_attestation(env, att, intake.signer(env), h)
        except (EnvelopeError, Rejected):
            report.stale_attestations.append(data)
            continue
        report.attestations += 1
        report.evicted.extend(evicted)
    for data in agents:
        try:
            env = Envelope.decode(data)
            cards = intake.open_cards(env, now)
            state.cards.merge(env, cards, env.content_hash, now)
        except (EnvelopeError, Rejected):
            report.stale_agents.append(data)
            continue
        report.agents += 1
        if cards.peer_id == own_peer_id:
            report.own_cards_seq = max(report.own_cards_seq, cards.seq)
    return report
