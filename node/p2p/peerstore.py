"""The persistent peer store: peers this node was connected to, kept in the node's SQLite DB.

A restarted node reconnects from it without any bootstrap address: the membership service
loads the stored addresses at start and hands them to its machine as known peers (dialled like
any peer learnt by exchange, after the configured bootstrap peers), and saves the peers that
are ready now every ``SAVE_INTERVAL_S`` and when it stops.

What is kept: one row per peer, its dialable addresses (each ending in ``/p2p/<peer id>``) and
when it was last ready (Unix epoch ms). Bounded: the ``MAX_STORED_PEERS`` most recently seen
rows stay, rows not seen for ``FORGET_AFTER_MS`` go. No libp2p here: rows are plain strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from node.db import Database
from protocol.membership.messages import MAX_ADDR_LEN, MAX_ADDRS
from protocol.names import peer_id_of_multiaddr

SCHEMA = """
CREATE TABLE IF NOT EXISTS peer_store (
    peer_id TEXT PRIMARY KEY,
    addrs TEXT NOT NULL,              -- JSON list of multiaddrs ending in /p2p/<peer_id>
    last_ready_at_ms INTEGER NOT NULL -- Unix epoch ms
)
"""
#: rows kept, most recently seen first
MAX_STORED_PEERS = 256
#: a peer not seen ready for this long is forgotten (a week)
FORGET_AFTER_MS = 7 * 24 * 3600 * 1000
#: how often the membership service saves the peers that are ready
SAVE_INTERVAL_S = 5.0


class PeerStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def save(self, peers: Iterable[tuple[str, tuple[str, ...]]], now_ms: int) -> int:
        """Record ``(peer id, addrs)`` pairs as ready at ``now_ms``; prune; rows written."""
        rows = []
        for peer, addrs in peers:
            own = [a for a in addrs if peer_id_of_multiaddr(a) == peer and len(a) <= MAX_ADDR_LEN]
            if own:
                rows.append((peer, json.dumps(own[-MAX_ADDRS:]), now_ms))
        with self.db.transaction():
            self.db.executemany(
                "INSERT INTO peer_store(peer_id, addrs, last_ready_at_ms) VALUES(?, ?, ?) "
                "ON CONFLICT(peer_id) DO UPDATE SET addrs = excluded.addrs, "
                "last_ready_at_ms = excluded.last_ready_at_ms", rows)
            self.db.execute("DELETE FROM peer_store WHERE last_ready_at_ms < ?",
                            (now_ms - FORGET_AFTER_MS,))
            self.db.execute(
                "DELETE FROM peer_store WHERE peer_id NOT IN (SELECT peer_id FROM peer_store "
                "ORDER BY last_ready_at_ms DESC, peer_id LIMIT ?)", (MAX_STORED_PEERS,))
        return len(rows)

    def load(self) -> list[tuple[str, tuple[str, ...]]]:
        """Stored ``(peer id, addrs)``, most recently seen first; malformed rows skipped."""
        out = []
        for row in self.db.query(
                "SELECT peer_id, addrs FROM peer_store ORDER BY last_ready_at_ms DESC, peer_id"):
            try:
                addrs = json.loads(row["addrs"])
            except ValueError:
                continue
            if isinstance(addrs, list) and all(isinstance(a, str) for a in addrs):
                out.append((str(row["peer_id"]), tuple(addrs)))
        return out

    def count(self) -> int:
        return int(self.db.query("SELECT COUNT(*) AS n FROM peer_store")[0]["n"])
