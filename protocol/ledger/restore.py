"""Restoring a ledger from stored envelopes at start-up (sans-IO; the machine calls it).

Every stored envelope (the bytes as received) is checked again as a pushed one would be, at
``now``, and merged into the state; nothing is trusted because it was stored. Whatever no
longer passes (expired, corrupt) is reported by its stored bytes, and what the observer quota
evicted by content hash, so the store can delete them. No effects are produced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from crypto.envelope import Envelope, EnvelopeError
from protocol.ledger.intake import LedgerIntake, SignedT
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
    report.records, report.own_seq = _restore_signed(
        records, intake.open_record, state.merge_record, now, own_peer_id, report.stale_records
    )
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
    report.agents, report.own_cards_seq = _restore_signed(
        agents, intake.open_cards, state.cards.merge, now, own_peer_id, report.stale_agents
    )
    return report


def _restore_signed(
    blobs: Iterable[bytes],
    open_: Callable[[Envelope, int], SignedT],
    merge: Callable[[Envelope, SignedT, bytes, int], object],
    now: int,
    own_peer_id: str,
    stale: list[bytes],
) -> tuple[int, int]:
    """Check and merge stored capability or agent-card records: (how many passed, the highest
    seq of our own among them, 0: none); the bytes of those that no longer pass go to
    ``stale``."""
    merged = own_seq = 0
    for data in blobs:
        try:
            env = Envelope.decode(data)
            rec = open_(env, now)
            merge(env, rec, env.content_hash, now)
        except (EnvelopeError, Rejected):
            stale.append(data)
            continue
        merged += 1
        if rec.peer_id == own_peer_id:
            own_seq = max(own_seq, rec.seq)
    return merged, own_seq
