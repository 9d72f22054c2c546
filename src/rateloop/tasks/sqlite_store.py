"""The embedded task store: one SQLite file, WAL, safe for many processes on one machine.

Writes take SQLite's write lock at ``BEGIN IMMEDIATE`` so a read-modify-write
(claim, save, submit) is never interleaved with another process's; readers
never block writers in WAL mode.  ``synchronous=NORMAL`` by default: a
committed checkpoint survives any crash of a process (``kill -9`` included)
but the last few may roll back on a power loss or an OS crash, in which case
their steps run again under the same idempotency keys.  ``?synchronous=full``
makes every commit survive a power loss too, at one fsync per commit (about
ten times slower on a typical disk; see ``bench/tasks_bench.py``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rateloop._clock import Clock
from rateloop.errors import BackendError
from rateloop.tasks._migrations import SQLITE_MIGRATIONS
from rateloop.tasks._sqlstore import Query, SQLTaskStore

__all__ = ["SQLiteTaskStore"]


class SQLiteTaskStore(SQLTaskStore):
    """Tasks in a SQLite file (``sqlite:///path``)."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock | None = None,
        synchronous: str = "normal",
        timeout_secs: float = 30.0,
    ) -> None:
        super().__init__(clock=clock, url=f"sqlite:///{path}")
        if synchronous.lower() not in ("full", "normal"):
            raise ValueError(f"synchronous must be 'full' or 'normal', got {synchronous!r}")
        self.path = str(path)
        try:
            # Autocommit mode: every transaction below is explicit. One store may be used
            # from several threads (a heartbeat, asyncio.to_thread) behind self._lock.
            self._conn = sqlite3.connect(
                self.path, timeout=timeout_secs, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._conn.execute(f"PRAGMA busy_timeout={int(timeout_secs * 1000)}")
        except sqlite3.Error as exc:
            raise BackendError(f"cannot open the SQLite task store {self.path!r}: {exc}") from exc
        self._migrate()

    def _migrate(self) -> None:
        with self._lock, self._transaction(True) as q:
            q("CREATE TABLE IF NOT EXISTS rateloop_tasks_schema "
              "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)", ())
            done = {int(v) for (v,) in q("SELECT version FROM rateloop_tasks_schema", ())}
            for version, statements in SQLITE_MIGRATIONS:
                if version in done:
                    continue
                for sql in statements:
                    q(sql, ())
                q("INSERT INTO rateloop_tasks_schema VALUES (?, ?)",
                  (version, self.clock.now().timestamp()))

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Query]:
        conn = self._conn

        def q(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
            return conn.execute(sql, tuple(params)).fetchall()

        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            raise BackendError(f"SQLite task store {self.path!r}: {exc}") from exc
        try:
            yield q
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise BackendError(f"SQLite task store {self.path!r}: {exc}") from exc
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise BackendError(f"SQLite task store {self.path!r}: {exc}") from exc

    def close(self) -> None:
        self._conn.close()
