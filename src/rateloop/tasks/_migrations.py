"""Versioned schema migrations of the task stores, one list per engine.

Each entry is ``(version, statements)``; a store applies the versions its
``rateloop_tasks_schema`` table does not list yet, in order, in one
transaction, under the engine's write lock.  Never edit a released entry: add
the next version.
"""

from __future__ import annotations

__all__ = ["POSTGRES_MIGRATIONS", "SQLITE_MIGRATIONS"]

_ACTIVE = "'queued', 'running', 'waiting_for_reset', 'waiting_for_capacity'"

SQLITE_MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            """CREATE TABLE rateloop_tasks (
                task_id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                state TEXT NOT NULL,
                priority TEXT NOT NULL,
                rank_at REAL NOT NULL,
                args TEXT NOT NULL,
                steps TEXT NOT NULL,
                checkpoint TEXT NOT NULL,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL,
                next_attempt_at REAL NOT NULL,
                deadline REAL,
                lease_owner TEXT,
                lease_expires_at REAL,
                fence INTEGER NOT NULL DEFAULT 0,
                deliveries INTEGER NOT NULL DEFAULT 0
            )""",
            f"CREATE INDEX rateloop_tasks_ready ON rateloop_tasks (rank_at, created_at) "
            f"WHERE state IN ({_ACTIVE})",
            "CREATE INDEX rateloop_tasks_state ON rateloop_tasks (state)",
        ],
    ),
    (
        2,
        [
            # Why each delivery happened (rateloop tasks show); one row per claim.
            """CREATE TABLE rateloop_task_deliveries (
                task_id TEXT NOT NULL,
                delivery INTEGER NOT NULL,
                at REAL NOT NULL,
                worker_id TEXT NOT NULL,
                reason TEXT NOT NULL,
                previous_owner TEXT,
                detail TEXT NOT NULL DEFAULT '',
                PRIMARY KEY (task_id, delivery)
            )""",
            # The running workers and the task names they know (rateloop tasks list).
            """CREATE TABLE rateloop_workers (
                worker_id TEXT PRIMARY KEY,
                tasks TEXT NOT NULL,
                seen_at REAL NOT NULL,
                expires_at REAL NOT NULL
            )""",
        ],
    ),
]

POSTGRES_MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            """CREATE TABLE {schema}.rateloop_tasks (
                task_id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                state TEXT NOT NULL,
                priority TEXT NOT NULL,
                rank_at DOUBLE PRECISION NOT NULL,
                args TEXT NOT NULL,
                steps TEXT NOT NULL,
                checkpoint TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                next_attempt_at DOUBLE PRECISION NOT NULL,
                deadline DOUBLE PRECISION,
                lease_owner TEXT,
                lease_expires_at DOUBLE PRECISION,
                fence BIGINT NOT NULL DEFAULT 0,
                deliveries BIGINT NOT NULL DEFAULT 0
            )""",
            f"CREATE INDEX rateloop_tasks_ready ON {{schema}}.rateloop_tasks (rank_at, created_at) "
            f"WHERE state IN ({_ACTIVE})",
            "CREATE INDEX rateloop_tasks_state ON {schema}.rateloop_tasks (state)",
        ],
    ),
    (
        2,
        [
            """CREATE TABLE {schema}.rateloop_task_deliveries (
                task_id TEXT NOT NULL,
                delivery BIGINT NOT NULL,
                at DOUBLE PRECISION NOT NULL,
                worker_id TEXT NOT NULL,
                reason TEXT NOT NULL,
                previous_owner TEXT,
                detail TEXT NOT NULL DEFAULT '',
                PRIMARY KEY (task_id, delivery)
            )""",
            """CREATE TABLE {schema}.rateloop_workers (
                worker_id TEXT PRIMARY KEY,
                tasks TEXT NOT NULL,
                seen_at DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION NOT NULL
            )""",
        ],
    ),
]
