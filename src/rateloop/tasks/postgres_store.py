"""The shared task store: PostgreSQL through psycopg 3, for many workers on many machines.

Workers take tasks with ``SELECT … FOR UPDATE SKIP LOCKED``: two workers never
wait on, or take, the same row.  Submits hold a transaction-scoped advisory
lock so the queue's depth bound holds under concurrent submitters.  The
tables live in one schema (``?schema=name`` in the URL, ``rateloop`` by
default), created and migrated on open.  Lease expiry compares the workers'
clocks: keep them NTP-synchronized (a lease is tens of seconds; skew of a
second or two is harmless).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rateloop._clock import Clock
from rateloop._redact import redact_url
from rateloop.errors import BackendError
from rateloop.tasks._migrations import POSTGRES_MIGRATIONS
from rateloop.tasks._sqlstore import Query, SQLTaskStore

__all__ = ["PostgresTaskStore"]

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class PostgresTaskStore(SQLTaskStore):
    """Tasks in PostgreSQL (``postgresql://user@host:port/db?schema=name``)."""

    _lock_clause = " FOR UPDATE SKIP LOCKED"

    def __init__(
        self, dsn: str, *, schema: str = "rateloop", clock: Clock | None = None
    ) -> None:
        shown = redact_url(dsn)
        super().__init__(clock=clock, url=f"{shown}?schema={schema}")
        if not _IDENT.match(schema):
            raise ValueError(
                f"schema must be a lower-case SQL identifier ([a-z_][a-z0-9_]*), got {schema!r}"
            )
        self.schema = schema
        self.table = f"{schema}.rateloop_tasks"
        try:
            import psycopg
        except ImportError as exc:
            raise ImportError(
                "the PostgreSQL task store needs psycopg 3: pip install 'rateloop[postgres]'"
            ) from exc
        self._errors: tuple[type[BaseException], ...] = (psycopg.Error,)
        try:
            self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise BackendError(
                f"cannot reach the PostgreSQL task store at {shown}: {exc}; is the server "
                "running and the database created?"
            ) from exc
        self._migrate()

    def _migrate(self) -> None:
        with self._lock, self._transaction(True) as q:
            q("SELECT pg_advisory_xact_lock(hashtext(?))", (f"rateloop-migrate:{self.schema}",))
            q(f"CREATE SCHEMA IF NOT EXISTS {self.schema}", ())
            q(f"CREATE TABLE IF NOT EXISTS {self.schema}.rateloop_tasks_schema "
              "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)", ())
            rows = q(f"SELECT version FROM {self.schema}.rateloop_tasks_schema", ())
            done = {int(v) for (v,) in rows}
            for version, statements in POSTGRES_MIGRATIONS:
                if version in done:
                    continue
                for sql in statements:
                    q(sql.format(schema=self.schema), ())
                q(f"INSERT INTO {self.schema}.rateloop_tasks_schema VALUES (?, ?)",
                  (version, self.clock.now().timestamp()))

    def _lock_queue(self, q: Query) -> None:
        q("SELECT pg_advisory_xact_lock(hashtext(?))", (f"rateloop-submit:{self.schema}",))

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Query]:
        conn = self._conn

        def q(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
            cur = conn.execute(sql.replace("?", "%s"), tuple(params))
            return cur.fetchall() if cur.description is not None else []

        try:
            with conn.transaction():
                yield q
        except self._errors as exc:
            raise BackendError(f"PostgreSQL task store {self.url}: {exc}") from exc

    def drop(self) -> None:
        """Drop this store's schema and everything in it (tests and teardown)."""
        with self._lock, self._transaction(True) as q:
            q(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE", ())

    def close(self) -> None:
        self._conn.close()
