"""The ledger's SQLite tables: signed envelopes kept as received, so they can be re-served and
re-verified after a restart.

* ``ledger_records``: one row per peer, its newest capability record (the machine decides which
  is newest; the store replaces). ``envelope`` is ``Envelope.encode()`` of what arrived: the
  payload bytes exactly as signed.
* ``ledger_agents``: one row per node, its newest agent-card record (protocol/agents/cards.py),
  replaced like ``ledger_records``.
* ``ledger_attestations``: one row per attestation, keyed by the envelope's content hash, with
  a few columns copied out of the (verified) payload for indexed queries.

Nothing is trusted on load: ``load()`` returns the envelope bytes and the machine re-verifies
them (``LedgerMachine.restore``); ``delete_stale`` removes what no longer passes. Every write is
one statement, so a kill at any instant leaves the tables consistent (WAL, node/db.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from crypto.envelope import Envelope
from node.db import Database
from protocol.agents.cards import AgentCards
from protocol.ledger.machine import RestoreReport
from protocol.ledger.records import Attestation, CapabilityRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_records (
    peer_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,   -- Unix epoch ms
    envelope BLOB NOT NULL            -- crypto.envelope.Envelope.encode() as received
);
CREATE TABLE IF NOT EXISTS ledger_agents (
    peer_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,   -- Unix epoch ms
    envelope BLOB NOT NULL            -- Envelope.encode() as received
);
CREATE TABLE IF NOT EXISTS ledger_attestations (
    hash BLOB PRIMARY KEY,            -- Envelope.content_hash
    subject TEXT NOT NULL,
    observer TEXT NOT NULL,
    kind TEXT NOT NULL,
    observed_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    envelope BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_attestations_by_subject ON ledger_attestations(subject);
CREATE INDEX IF NOT EXISTS ledger_attestations_by_expiry ON ledger_attestations(expires_at_ms);
"""


class LedgerStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def load(self) -> tuple[list[bytes], list[bytes]]:
        """Stored record and attestation envelopes (bytes), oldest attestations first."""
        records = [
            bytes(r[0])
            for r in self.db.query("SELECT envelope FROM ledger_records ORDER BY peer_id")
        ]
        atts = [
            bytes(r[0])
            for r in self.db.query(
                "SELECT envelope FROM ledger_attestations ORDER BY observed_at_ms, hash"
            )
        ]
        return records, atts

    def save_capability(self, envelope: Envelope, record: CapabilityRecord) -> None:
        self._replace("ledger_records", envelope, record)

    def load_agents(self) -> list[bytes]:
        """Stored agent-card record envelopes (bytes)."""
        rows = self.db.query("SELECT envelope FROM ledger_agents ORDER BY peer_id")
        return [bytes(r[0]) for r in rows]

    def save_agents(self, envelope: Envelope, record: AgentCards) -> None:
        self._replace("ledger_agents", envelope, record)

    def _replace(
        self, table: str, envelope: Envelope, record: CapabilityRecord | AgentCards
    ) -> None:
        """Store ``envelope`` as ``record.peer_id``'s one row of ``table`` (a constant name:
        ``ledger_records`` or ``ledger_agents``), replacing an older one."""
        self.db.execute(
            f"INSERT INTO {table}(peer_id, seq, expires_at_ms, envelope) VALUES(?, ?, ?, ?) "
            "ON CONFLICT(peer_id) DO UPDATE SET seq = excluded.seq, "
            "expires_at_ms = excluded.expires_at_ms, envelope = excluded.envelope",
            (record.peer_id, record.seq, record.expires_at_ms, envelope.encode()),
        )

    def forget_agents(self, peer_ids: Iterable[str]) -> None:
        with self.db.transaction():
            self.db.executemany(
                "DELETE FROM ledger_agents WHERE peer_id = ?", [(p,) for p in peer_ids]
            )

    def save_attestation(self, envelope: Envelope, att: Attestation, h: bytes) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO ledger_attestations"
            "(hash, subject, observer, kind, observed_at_ms, expires_at_ms, envelope) "
            "VALUES(?, ?, ?, ?, ?, ?, ?)",
            (
                h,
                att.subject,
                envelope.signer,
                att.kind.value,
                att.observed_at_ms,
                att.expires_at_ms,
                envelope.encode(),
            ),
        )

    def forget_capabilities(self, peer_ids: Iterable[str]) -> None:
        with self.db.transaction():
            self.db.executemany(
                "DELETE FROM ledger_records WHERE peer_id = ?", [(p,) for p in peer_ids]
            )

    def forget_attestations(self, hashes: Iterable[bytes]) -> None:
        with self.db.transaction():
            self.db.executemany(
                "DELETE FROM ledger_attestations WHERE hash = ?", [(h,) for h in hashes]
            )

    def delete_stale(self, report: RestoreReport) -> None:
        """Delete what ``LedgerMachine.restore`` found no longer valid."""
        with self.db.transaction():
            self.db.executemany(
                "DELETE FROM ledger_records WHERE envelope = ?",
                [(e,) for e in report.stale_records],
            )
            self.db.executemany(
                "DELETE FROM ledger_attestations WHERE envelope = ?",
                [(e,) for e in report.stale_attestations],
            )
            self.db.executemany(
                "DELETE FROM ledger_attestations WHERE hash = ?", [(h,) for h in report.evicted]
            )
            self.db.executemany(
                "DELETE FROM ledger_agents WHERE envelope = ?", [(e,) for e in report.stale_agents]
            )

    def counts(self) -> dict[str, int]:
        return {
            "records": int(self.db.query("SELECT COUNT(*) FROM ledger_records")[0][0]),
            "attestations": int(self.db.query("SELECT COUNT(*) FROM ledger_attestations")[0][0]),
            "agents": int(self.db.query("SELECT COUNT(*) FROM ledger_agents")[0][0]),
        }
