"""Task states (the priority classes are :class:`rateloop.Priority`).

A task is *queued* (ready at ``next_attempt_at``), *running* (a worker holds
its lease), *waiting* (parked until ``next_attempt_at``, held by no process),
or in one terminal state.  ``cancelled`` is the operator's own terminal state
(``rateloop tasks cancel``); the others are the loop's.
"""

from __future__ import annotations

from enum import StrEnum

from rateloop.route import Priority

__all__ = ["READY_STATES", "TERMINAL_STATES", "WAITING_STATES", "PriorityClass", "TaskState"]


class TaskState(StrEnum):
    """Where a task is."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING_FOR_RESET = "waiting_for_reset"
    WAITING_FOR_CAPACITY = "waiting_for_capacity"
    COMPLETED = "completed"
    DEGRADED = "degraded"
    PARTIAL = "partial"
    NEEDS_OPERATOR = "needs_operator"
    FAILED_RETRY_EXHAUSTED = "failed_retry_exhausted"
    EXPIRED = "expired"
    REJECTED = "rejected"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def waiting(self) -> bool:
        return self in WAITING_STATES


WAITING_STATES = frozenset({TaskState.WAITING_FOR_RESET, TaskState.WAITING_FOR_CAPACITY})
#: States a worker may take once ``next_attempt_at`` has come.
READY_STATES = frozenset({TaskState.QUEUED, *WAITING_STATES})
TERMINAL_STATES = frozenset(
    {
        TaskState.COMPLETED,
        TaskState.DEGRADED,
        TaskState.PARTIAL,
        TaskState.NEEDS_OPERATOR,
        TaskState.FAILED_RETRY_EXHAUSTED,
        TaskState.EXPIRED,
        TaskState.REJECTED,
        TaskState.CANCELLED,
    }
)


#: The queue's priority classes: the one :class:`rateloop.Priority`, under its old name.
PriorityClass = Priority
