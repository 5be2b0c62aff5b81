"""The node's SQLite database: one file in the data dir, WAL mode, owned by the daemon.

WAL with ``synchronous=NORMAL`` survives a kill of the process at any instant (only an OS crash
can lose the last transactions, never corrupt the file). Each service keeps its own tables and
declares their schema as ``CREATE TABLE IF NOT EXISTS`` statements. Writes that belong together
go in one ``with db.transaction():`` block, so a kill leaves either all or none of them.

The connection is used from the trio thread only; statements are small and indexed, so they run
inline. Bulk work (thousands of rows) should batch with ``executemany`` inside one transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Database:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves in transaction()
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.conn.execute("PRAGMA busy_timeout=5000")
        self._depth = 0

    def apply_schema(self, schema: str) -> None:
        with self.transaction():
            for statement in schema.split(";"):
                if statement.strip():
                    self.conn.execute(statement)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """All-or-nothing block; nested uses join the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield self.conn
            finally:
                self._depth -= 1
            return
        self.conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        else:
            self.conn.execute("COMMIT")
        finally:
            self._depth = 0

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        return self.conn.executemany(sql, rows)

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        return self.conn.execute(sql, params).fetchall()

    def close(self) -> None:
        self.conn.close()
