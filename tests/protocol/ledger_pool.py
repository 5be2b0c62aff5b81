"""A pool of signed ledger items that covers every merge rule: several seqs per peer, two
records with one seq, an observer over its per-minute quota, and items of another network.
The CRDT tests draw streams from it, as do the state-cache and memo tests."""

from __future__ import annotations

from crypto.envelope import Envelope
from protocol.ledger.records import AttestationKind
from tests.protocol.ledger_net import T0, attestation, identity, record

PEERS = [identity(20 + i) for i in range(4)]


def _pool() -> list[tuple[str, Envelope]]:
    items: list[tuple[str, Envelope]] = []
    for p in PEERS:
        for seq in (1, 2, 3):
            items.append(("r", record(p, seq, price_per_1k_tokens=float(seq))))
    items.append(("r", record(PEERS[0], 3, price_per_1k_tokens=99.0)))  # same seq, other content
    for i, obs in enumerate(PEERS):
        for j, subj in enumerate(PEERS):
            if i != j:
                kind = list(AttestationKind)[(i + j) % 3]
                items.append(
                    ("a", attestation(obs, subj.peer_id, kind=kind, object_id=bytes([i, j])))
                )
    flooder = identity(99)
    for k in range(6):  # same observer, same minute: only 3 survive
        items.append(
            ("a", attestation(flooder, PEERS[0].peer_id, object_id=bytes([k]), now=T0 - 1000))
        )
    items.append(("r", record(PEERS[1], 7, network="othernet")))
    items.append(("a", attestation(PEERS[1], PEERS[2].peer_id, network="othernet")))
    return items


POOL = _pool()
