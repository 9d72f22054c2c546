"""The task store's algorithm over SQL, shared by the SQLite and PostgreSQL stores.

How it works: one table holds a row per task — the queue's columns (state,
rank, ``next_attempt_at``, lease owner and expiry, a *fence*) and the
checkpoint as JSON.  Every change is a read-modify-write inside one
transaction.  Taking a task (``claim``) picks the ready row with the lowest
rank — queued or waiting rows whose ``next_attempt_at`` has come, or running
rows whose lease has expired — among the task names the worker has
definitions for, bumps its fence, leases it, and records why it was delivered
(a row in ``rateloop_task_deliveries``).  A heartbeat extends the lease, and a
checkpoint never shortens it (the record a worker carries holds the expiry of
its claim, older than its heartbeats).  Every later write by that worker
names the fence it got; a write with an older fence
changes nothing, so a worker that lost its lease (paused past it, cancelled
by an operator) can never overwrite the task's new owner.  Worker processes
announce the task names they know in ``rateloop_workers`` (see
:mod:`rateloop.tasks.presence`).

The engines differ only in how a transaction locks (``BEGIN IMMEDIATE`` on
SQLite; ``FOR UPDATE SKIP LOCKED`` and an advisory lock on PostgreSQL), in the
placeholder and in the DDL, which the subclasses provide.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from rateloop._clock import Clock, system_clock
from rateloop.tasks.deliveries import Delivery, DeliveryReason, delivery_of
from rateloop.tasks.model import Checkpoint, TaskRecord
from rateloop.tasks.presence import WorkerPresence
from rateloop.tasks.queue import QueuePolicy, admit_submit
from rateloop.tasks.states import (
    READY_STATES,
    TERMINAL_STATES,
    PriorityClass,
    TaskState,
)

__all__ = ["Query", "SQLTaskStore"]

Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]

_COLUMNS = (
    "task_id, name, state, priority, rank_at, args, steps, checkpoint, created_at, updated_at, "
    "next_attempt_at, deadline, lease_owner, lease_expires_at, fence, deliveries"
)
_UNFINISHED = tuple(s.value for s in (*READY_STATES, TaskState.RUNNING))
_READY = tuple(s.value for s in READY_STATES)
_RETRYABLE = frozenset(TERMINAL_STATES - {TaskState.COMPLETED, TaskState.DEGRADED}) | READY_STATES


def _ts(when: datetime | None) -> float | None:
    return when.timestamp() if when is not None else None


def _dt(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _in(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)  # our own enum values, never user input


class SQLTaskStore:
    """Base of the SQL stores; subclasses provide ``_transaction`` and a few SQL fragments."""

    table: str = "rateloop_tasks"
    _lock_clause: str = ""  # appended to the claim's SELECT

    def __init__(self, *, clock: Clock | None = None, url: str = "") -> None:
        self.clock = clock if clock is not None else system_clock
        self.url = url
        self._lock = threading.Lock()  # one connection, one operation at a time

    # --- engine hooks ---------------------------------------------------------------

    def _transaction(self, write: bool) -> AbstractContextManager[Query]:
        raise NotImplementedError

    def _lock_queue(self, q: Query) -> None:
        """Serialize submits so the depth check holds (SQLite's write lock already does)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> SQLTaskStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # --- rows -----------------------------------------------------------------------

    def _row(self, row: tuple[Any, ...]) -> TaskRecord:
        (task_id, name, state, priority, _rank, args, steps, checkpoint, created, updated,
         next_at, deadline, owner, expires, fence, deliveries) = row
        return TaskRecord(
            task_id=task_id,
            name=name,
            state=TaskState(state),
            priority=PriorityClass(priority),
            args=json.loads(args),
            steps=tuple(json.loads(steps)),
            checkpoint=Checkpoint.from_json(checkpoint),
            created_at=_dt(created) or self.clock.now(),
            updated_at=_dt(updated) or self.clock.now(),
            next_attempt_at=_dt(next_at) or self.clock.now(),
            deadline=_dt(deadline),
            lease_owner=owner,
            lease_expires_at=_dt(expires),
            fence=int(fence),
            deliveries=int(deliveries),
        )

    def _values(self, rec: TaskRecord, rank: float) -> tuple[Any, ...]:
        return (
            rec.task_id, rec.name, rec.state.value, rec.priority.value, rank,
            json.dumps(rec.args, sort_keys=True), json.dumps(list(rec.steps)),
            rec.checkpoint.to_json(), _ts(rec.created_at), _ts(rec.updated_at),
            _ts(rec.next_attempt_at), _ts(rec.deadline), rec.lease_owner,
            _ts(rec.lease_expires_at), rec.fence, rec.deliveries,
        )

    def _select(self, q: Query, task_id: str, lock: bool = False) -> TaskRecord | None:
        rows = q(
            f"SELECT {_COLUMNS} FROM {self.table} WHERE task_id = ?"
            + (self._lock_clause.replace(" SKIP LOCKED", "") if lock else ""),
            (task_id,),
        )
        return self._row(rows[0]) if rows else None

    def _update(self, q: Query, rec: TaskRecord, *, fence: int, keep_lease: bool = False) -> bool:
        """Write every mutable column, only when the row still carries ``fence``.

        With ``keep_lease``, a running record's expiry is the later of the
        stored one and the record's: what a worker carries since its claim is
        older than its heartbeats, and writing it back would hand the task to
        the next idle worker while this one is alive.
        """
        expires = _ts(rec.lease_expires_at)
        lease_sql, lease_args = "?", [expires]
        if keep_lease and rec.state is TaskState.RUNNING and expires is not None:
            lease_sql = (
                "CASE WHEN lease_expires_at IS NOT NULL AND lease_expires_at > ? "
                "THEN lease_expires_at ELSE ? END"
            )
            lease_args = [expires, expires]
        rows = q(
            f"UPDATE {self.table} SET state = ?, checkpoint = ?, updated_at = ?, "
            f"next_attempt_at = ?, deadline = ?, lease_owner = ?, lease_expires_at = {lease_sql}, "
            "fence = ?, deliveries = ? WHERE task_id = ? AND fence = ? RETURNING task_id",
            (
                rec.state.value, rec.checkpoint.to_json(), _ts(rec.updated_at),
                _ts(rec.next_attempt_at), _ts(rec.deadline), rec.lease_owner,
                *lease_args, rec.fence, rec.deliveries, rec.task_id, fence,
            ),
        )
        return bool(rows)

    # --- the protocol ----------------------------------------------------------------

    def submit(self, rec: TaskRecord, policy: QueuePolicy) -> TaskRecord:
        """Queue ``rec``, or store it ``rejected`` (queue full, or it could not start in time).

        Submitting a task id that exists already returns the stored task unchanged.
        """
        rank = policy.rank(rec.created_at, rec.priority)
        with self._lock, self._transaction(True) as q:
            self._lock_queue(q)
            existing = self._select(q, rec.task_id)
            if existing is not None:
                return existing
            depth = q(f"SELECT COUNT(*) FROM {self.table} WHERE state IN ({_in(_UNFINISHED)})", ())
            ahead = q(
                f"SELECT COUNT(*) FROM {self.table} "
                f"WHERE state IN ({_in(_READY)}) AND rank_at <= ?",
                (rank,),
            )
            verdict = admit_submit(
                policy,
                now=rec.created_at,
                depth=int(depth[0][0]),
                ahead=int(ahead[0][0]),
                not_before=rec.next_attempt_at,
                deadline=rec.deadline,
            )
            if not verdict.accepted:
                rec = replace(rec, state=TaskState.REJECTED).with_checkpoint(
                    reason=verdict.reason,
                    user_visible_status=f"rejected at submit: {verdict.reason}",
                )
            q(
                f"INSERT INTO {self.table} ({_COLUMNS}) VALUES ({', '.join('?' * 16)})",
                self._values(rec, rank),
            )
            return rec

    def claim(
        self, worker_id: str, *, lease_secs: float, names: Collection[str] | None = None
    ) -> TaskRecord | None:
        """Lease the most urgent ready task to ``worker_id``; None when nothing is ready.

        ``names`` (None: any) are the tasks the worker has definitions for: a task
        of another name stays in the queue, untouched, for a worker that knows it.
        Taking a task whose lease expired is a *redelivery*; taking a parked one
        at its time is a *wake*.  Both count in the ledger and spend one unit of
        the task's retry budget.  Why the task was delivered is recorded
        (:meth:`deliveries`).
        """
        if names is not None and not names:
            return None
        known = sorted(names) if names is not None else []
        by_name = f"AND name IN ({', '.join('?' * len(known))}) " if known else ""
        now = self.clock.now()
        t = now.timestamp()
        with self._lock, self._transaction(True) as q:
            rows = q(
                f"SELECT {_COLUMNS} FROM {self.table} WHERE "
                f"((state IN ({_in(_READY)}) AND next_attempt_at <= ?) OR "
                f"(state = 'running' AND lease_expires_at <= ?)) {by_name}"
                f"ORDER BY rank_at, created_at LIMIT 1{self._lock_clause}",
                (t, t, *known),
            )
            if not rows:
                return None
            rec = self._row(rows[0])
            ck = rec.checkpoint
            ledger, budget = ck.attempts_used, ck.retry_budget_remaining
            if rec.state is TaskState.RUNNING:
                ledger, budget = replace(ledger, redeliveries=ledger.redeliveries + 1), budget - 1
            elif rec.state.waiting:
                # A step that saved its progress is following work the provider is doing (a
                # batch in flight): it wakes to look, not to try again.  The wake is counted,
                # but only a retry spends the retry budget.
                spend = 0 if ck.step_progress is not None else 1
                ledger, budget = replace(ledger, wakes=ledger.wakes + 1), budget - spend
            claimed = replace(
                rec,
                state=TaskState.RUNNING,
                updated_at=now,
                lease_owner=worker_id,
                lease_expires_at=now + timedelta(seconds=lease_secs),
                fence=rec.fence + 1,
                deliveries=rec.deliveries + 1,
            ).with_checkpoint(attempts_used=ledger, retry_budget_remaining=budget)
            self._update(q, claimed, fence=rec.fence)
            self._record_delivery(q, rec.task_id, delivery_of(rec, worker_id, now))
            return claimed

    def _record_delivery(self, q: Query, task_id: str, d: Delivery) -> None:
        # An upsert: a delivery number is written once per claim; should one ever come
        # back (a row restored from a backup), the newer claim's reason wins.
        q(
            f"INSERT INTO {self._deliveries_table} "
            "(task_id, delivery, at, worker_id, reason, previous_owner, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (task_id, delivery) DO UPDATE SET "
            "at = excluded.at, worker_id = excluded.worker_id, reason = excluded.reason, "
            "previous_owner = excluded.previous_owner, detail = excluded.detail",
            (task_id, d.delivery, d.at.timestamp(), d.worker_id, d.reason.value,
             d.previous_owner, d.detail),
        )

    def heartbeat(self, task_id: str, fence: int, *, lease_secs: float) -> bool:
        """Extend the lease; False when the worker no longer holds it."""
        now = self.clock.now()
        with self._lock, self._transaction(True) as q:
            rows = q(
                f"UPDATE {self.table} SET lease_expires_at = ? "
                "WHERE task_id = ? AND fence = ? AND state = 'running' RETURNING task_id",
                ((now + timedelta(seconds=lease_secs)).timestamp(), task_id, fence),
            )
            return bool(rows)

    def save(self, rec: TaskRecord, *, fence: int) -> bool:
        """Write a checkpoint (and state) if the worker still holds fence ``fence``.

        A checkpoint of a running task never shortens its lease: the stored
        expiry (a heartbeat's) stays unless the record's is later (a worker
        renewing it).  A record that leaves ``running`` clears the lease.
        """
        with self._lock, self._transaction(True) as q:
            return self._update(
                q, replace(rec, updated_at=self.clock.now()), fence=fence, keep_lease=True
            )

    def get(self, task_id: str) -> TaskRecord | None:
        with self._lock, self._transaction(False) as q:
            return self._select(q, task_id)

    def list_tasks(
        self, *, states: Sequence[TaskState] | None = None, limit: int = 100
    ) -> list[TaskRecord]:
        """Tasks, most urgent first; ``states`` filters."""
        where = f"WHERE state IN ({_in([s.value for s in states])}) " if states else ""
        with self._lock, self._transaction(False) as q:
            rows = q(
                f"SELECT {_COLUMNS} FROM {self.table} {where}ORDER BY rank_at, created_at LIMIT ?",
                (limit,),
            )
            return [self._row(r) for r in rows]

    def counts(self) -> dict[TaskState, int]:
        with self._lock, self._transaction(False) as q:
            rows = q(f"SELECT state, COUNT(*) FROM {self.table} GROUP BY state", ())
        return {TaskState(s): int(n) for s, n in rows}

    def _operator(self, task_id: str, change: Callable[[TaskRecord], TaskRecord]) -> TaskRecord:
        with self._lock, self._transaction(True) as q:
            rec = self._select(q, task_id, lock=True)
            if rec is None:
                raise KeyError(f"no task {task_id!r} in {self!r}")
            new = replace(change(rec), fence=rec.fence + 1, updated_at=self.clock.now())
            self._update(q, new, fence=rec.fence)
            return new

    def retry(
        self, task_id: str, *, budget: int = 20, accept_version: str | None = None
    ) -> TaskRecord:
        """Queue an unsuccessful or waiting task again now (an operator's decision).

        A passed deadline is dropped; ``accept_version`` records that the
        checkpoint is valid for a new workflow version.
        """

        def change(rec: TaskRecord) -> TaskRecord:
            if rec.state not in _RETRYABLE:
                raise ValueError(
                    f"task {task_id!r} is {rec.state.value}; retry is allowed from "
                    f"{', '.join(sorted(s.value for s in _RETRYABLE))}"
                )
            now = self.clock.now()
            deadline = rec.deadline if rec.deadline is None or rec.deadline > now else None
            version = accept_version or rec.checkpoint.workflow_version
            return replace(
                rec, state=TaskState.QUEUED, next_attempt_at=now, deadline=deadline,
                lease_owner=None, lease_expires_at=None,
            ).with_checkpoint(
                retry_budget_remaining=max(budget, 1), task_deadline=deadline,
                workflow_version=version, next_attempt_at=now,
                reason="retried by an operator", user_visible_status="queued (retried)",
            )

        return self._operator(task_id, change)

    def cancel(self, task_id: str) -> TaskRecord:
        """End an unfinished task ``cancelled``; its worker's next write is refused."""

        def change(rec: TaskRecord) -> TaskRecord:
            if rec.state.terminal:
                raise ValueError(f"task {task_id!r} is already {rec.state.value}")
            return replace(
                rec, state=TaskState.CANCELLED, lease_owner=None, lease_expires_at=None
            ).with_checkpoint(
                reason="cancelled by an operator",
                user_visible_status=f"cancelled; not done: {', '.join(rec.remaining)}",
            )

        return self._operator(task_id, change)

    # --- deliveries and running workers ---------------------------------------------

    def _sibling(self, name: str) -> str:
        """Another table of this store, in the same schema as ``self.table``."""
        schema, dot, _ = self.table.rpartition(".")
        return f"{schema}{dot}{name}"

    @property
    def _deliveries_table(self) -> str:
        return self._sibling("rateloop_task_deliveries")

    @property
    def _workers_table(self) -> str:
        return self._sibling("rateloop_workers")

    def deliveries(self, task_id: str) -> list[Delivery]:
        """Why each delivery of a task happened, the first first."""
        with self._lock, self._transaction(False) as q:
            rows = q(
                "SELECT delivery, at, worker_id, reason, previous_owner, detail "
                f"FROM {self._deliveries_table} WHERE task_id = ? ORDER BY delivery",
                (task_id,),
            )
        return [
            Delivery(delivery=int(n), at=_dt(at) or self.clock.now(), worker_id=worker,
                     reason=DeliveryReason(reason), previous_owner=previous, detail=detail)
            for n, at, worker, reason, previous, detail in rows
        ]

    def announce_worker(
        self, worker_id: str, tasks: Collection[str], *, ttl_secs: float
    ) -> None:
        """Say that ``worker_id`` runs and knows ``tasks``, for ``ttl_secs`` unless renewed."""
        now = self.clock.now().timestamp()
        with self._lock, self._transaction(True) as q:
            q(
                f"INSERT INTO {self._workers_table} (worker_id, tasks, seen_at, expires_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (worker_id) DO UPDATE SET "
                "tasks = excluded.tasks, seen_at = excluded.seen_at, "
                "expires_at = excluded.expires_at",
                (worker_id, json.dumps(sorted(tasks)), now, now + ttl_secs),
            )
            # Killed workers never retire: forget them a day after they went silent.
            q(f"DELETE FROM {self._workers_table} WHERE expires_at < ?", (now - 86400.0,))

    def retire_worker(self, worker_id: str) -> None:
        """``worker_id`` stopped: it no longer counts as running."""
        with self._lock, self._transaction(True) as q:
            q(f"DELETE FROM {self._workers_table} WHERE worker_id = ?", (worker_id,))

    def live_workers(self) -> list[WorkerPresence]:
        """The workers whose announcement has not run out, by id."""
        now = self.clock.now().timestamp()
        with self._lock, self._transaction(False) as q:
            rows = q(
                f"SELECT worker_id, tasks, seen_at, expires_at FROM {self._workers_table} "
                "WHERE expires_at > ? ORDER BY worker_id",
                (now,),
            )
        return [
            WorkerPresence(worker_id=w, tasks=tuple(json.loads(tasks)),
                           seen_at=_dt(seen) or self.clock.now(),
                           expires_at=_dt(expires) or self.clock.now())
            for w, tasks, seen, expires in rows
        ]
