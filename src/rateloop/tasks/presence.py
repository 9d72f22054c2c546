"""Which workers are running on a store, and which task names they can run.

A worker process (``rateloop worker``, :func:`~rateloop.tasks.worker.run_worker`)
announces itself in the store with the names of the tasks it has definitions
for, refreshes that every :data:`PRESENCE_REFRESH_SECS`, and retires it when
it stops.  An announcement not refreshed for :data:`PRESENCE_TTL_SECS` (a
worker killed, stalled or cut off) no longer counts.  Workers only take tasks
they know (the claim filters by name), so a task no running worker knows waits
in the queue; :func:`worker_note` says so in ``rateloop tasks list``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rateloop.tasks.model import TaskRecord
from rateloop.tasks.states import READY_STATES

__all__ = ["PRESENCE_REFRESH_SECS", "PRESENCE_TTL_SECS", "WorkerPresence", "worker_note"]

#: How often a running worker renews its announcement.
PRESENCE_REFRESH_SECS = 10.0
#: How long an announcement counts without a renewal (three missed renewals).
PRESENCE_TTL_SECS = 3 * PRESENCE_REFRESH_SECS


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerPresence:
    """A running worker process as it announced itself."""

    worker_id: str
    tasks: tuple[str, ...]
    seen_at: datetime
    expires_at: datetime


def worker_note(rec: TaskRecord, live: Sequence[WorkerPresence]) -> str | None:
    """Why no worker will take ``rec`` (waiting to run, its name unknown to every running
    worker); None when a running worker knows it, or it is not waiting to run."""
    if rec.state not in READY_STATES:
        return None
    known = sorted({name for w in live for name in w.tasks})
    if rec.name in known:
        return None
    if not live:
        return f"no running worker knows task {rec.name!r}: no worker is running on this store"
    return (
        f"no running worker knows task {rec.name!r} (they know: {', '.join(known) or 'none'}); "
        "start a worker with the --app that defines it"
    )
