"""Durable tasks: checkpointed multi-step work, a bounded priority queue, crash-safe workers.

A task is a sequence of steps; each step is a call through the RATE loop.
Its result is checkpointed before the next step starts.  When a step's loop
ends ``waiting_for_reset`` or ``waiting_for_capacity`` the task is parked
with ``next_attempt_at`` and released: no process holds it, and any worker
continues it then.  Stores: SQLite (embedded, the default) and PostgreSQL
(shared), one conformance suite.  See ``docs/tasks.md``.
"""

from __future__ import annotations

from rateloop.tasks.definition import (
    LeaseLost,
    Step,
    StepContext,
    Task,
    TaskRegistry,
    registry,
    task,
)
from rateloop.tasks.deliveries import Delivery, DeliveryReason, delivery_summary
from rateloop.tasks.model import (
    USER_MESSAGE_POLICY,
    Checkpoint,
    CompletedStep,
    Ledger,
    PendingOperation,
    TaskRecord,
    runtime_summary,
)
from rateloop.tasks.postgres_store import PostgresTaskStore
from rateloop.tasks.presence import WorkerPresence
from rateloop.tasks.queue import QueuePolicy, SubmitVerdict, admit_submit
from rateloop.tasks.runner import AsyncTaskRunner, TaskRunner
from rateloop.tasks.sqlite_store import SQLiteTaskStore
from rateloop.tasks.states import (
    READY_STATES,
    TERMINAL_STATES,
    WAITING_STATES,
    PriorityClass,
    TaskState,
)
from rateloop.tasks.store import ALLOWED_URLS, TaskStore, check_store_url, open_store

__all__ = [
    "ALLOWED_URLS",
    "READY_STATES",
    "TERMINAL_STATES",
    "USER_MESSAGE_POLICY",
    "WAITING_STATES",
    "AsyncTaskRunner",
    "Checkpoint",
    "CompletedStep",
    "Delivery",
    "DeliveryReason",
    "LeaseLost",
    "Ledger",
    "PendingOperation",
    "PostgresTaskStore",
    "PriorityClass",
    "QueuePolicy",
    "SQLiteTaskStore",
    "Step",
    "StepContext",
    "SubmitVerdict",
    "Task",
    "TaskRecord",
    "TaskRegistry",
    "TaskRunner",
    "TaskState",
    "TaskStore",
    "WorkerPresence",
    "admit_submit",
    "check_store_url",
    "delivery_summary",
    "open_store",
    "registry",
    "runtime_summary",
    "task",
]
