"""The task queue as an operator sees it: depth, the oldest task, the next wake-ups.

Read through the task store's own read methods (``counts`` and
``list_tasks``), so the same code serves SQLite and PostgreSQL.  The oldest
task is exact while the queue holds at most ``limit`` unfinished tasks (the
store lists the most urgent first; beyond that it is the oldest of those).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from rateloop._url import url_scheme
from rateloop.errors import BackendError

__all__ = ["UNFINISHED", "QueueState", "open_store_readonly", "read_queue"]

#: The states of tasks still to do: the queue's depth.  Every other state is terminal.
UNFINISHED = ("queued", "running", "waiting_for_reset", "waiting_for_capacity")


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueState:
    """The queue at one moment."""

    at: datetime
    depth: int  # unfinished: queued, running, waiting
    by_state: dict[str, int]
    oldest_created_at: datetime | None
    oldest_exact: bool
    waiting: tuple[dict[str, Any], ...]  # parked tasks, soonest wake-up first

    @property
    def oldest_age_secs(self) -> float | None:
        if self.oldest_created_at is None:
            return None
        return max(0.0, (self.at - self.oldest_created_at).total_seconds())

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "depth": self.depth,
            "by_state": dict(sorted(self.by_state.items())),
            "oldest_created_at": (
                self.oldest_created_at.isoformat() if self.oldest_created_at else None
            ),
            "oldest_age_secs": (
                round(self.oldest_age_secs, 3) if self.oldest_age_secs is not None else None
            ),
            "oldest_exact": self.oldest_exact,
            "waiting": list(self.waiting),
        }


def read_queue(store: Any, now: datetime, *, limit: int = 1000) -> QueueState:
    """Depth by state, the oldest unfinished task and the parked tasks' wake-ups."""
    from rateloop.tasks.model import runtime_summary
    from rateloop.tasks.states import TaskState

    counts = {state.value: n for state, n in store.counts().items()}
    depth = sum(counts.get(s, 0) for s in UNFINISHED)
    records = store.list_tasks(states=[TaskState(s) for s in UNFINISHED], limit=limit)
    oldest = min((r.created_at for r in records), default=None)
    parked = sorted((r for r in records if r.state.waiting), key=lambda r: r.next_attempt_at)
    waiting = []
    for r in parked:
        summary = runtime_summary(r)
        waiting.append(
            {
                "task_id": r.task_id,
                "task": r.name,
                "state": r.state.value,
                "priority": r.priority.value,
                "retry_at": summary["retry_at"],
                "remaining_steps": summary["remaining_steps"],
                "deadline": summary["deadline"],
                "reason": summary["reason"],
            }
        )
    return QueueState(
        at=now,
        depth=depth,
        by_state=counts,
        oldest_created_at=oldest,
        oldest_exact=depth <= len(records),
        waiting=tuple(waiting),
    )


def open_store_readonly(url: str) -> Any:
    """Open an existing task store; a SQLite file that does not exist is an error, not created."""
    from rateloop.tasks.store import open_store

    if url_scheme(url) == "sqlite":
        path = urlsplit(url).path[1:]
        if path and not os.path.exists(path):
            raise BackendError(
                f"no task store at {path!r}: pass the --store URL your workers use "
                "(e.g. sqlite:///tasks.db or postgresql://...)"
            )
    return open_store(url)
