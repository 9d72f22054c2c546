"""Why each delivery of a task happened: recorded by the store at claim, told by ``tasks show``.

A *delivery* is one claim of a task by a worker.  The store knows, at the
moment of the claim and from the row alone, why the task was ready:

- ``first``: it had never been delivered;
- ``lease_expired``: a worker held it (``previous_owner``) and its lease ran out
  — the worker died, stalled, or lost its store;
- ``wake``: it was parked (``waiting_for_reset`` / ``waiting_for_capacity``) and
  its time came;
- ``requeued``: it was queued again after a delivery — released by a worker
  that stopped between steps, or retried by an operator (``detail`` is the
  status it was queued with).

:func:`delivery_of` decides it (no I/O); :func:`delivery_summary` tells it in
one line.  A delivery records ids, states and times only: never arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from rateloop.tasks.model import TaskRecord
from rateloop.tasks.states import TaskState

__all__ = ["Delivery", "DeliveryReason", "delivery_of", "delivery_summary"]


class DeliveryReason(StrEnum):
    FIRST = "first"
    LEASE_EXPIRED = "lease_expired"
    WAKE = "wake"
    REQUEUED = "requeued"


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One claim of a task: its number (1 = the first), when, by whom and why."""

    delivery: int
    at: datetime
    worker_id: str
    reason: DeliveryReason
    previous_owner: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"delivery": self.delivery, "at": self.at.isoformat(), "worker_id": self.worker_id,
                "reason": self.reason.value, "previous_owner": self.previous_owner,
                "detail": self.detail}


def delivery_of(rec: TaskRecord, worker_id: str, now: datetime) -> Delivery:
    """Why ``rec`` — the row as the claim read it, before it changed — is delivered now."""
    n = rec.deliveries + 1
    if rec.state is TaskState.RUNNING:
        expired = rec.lease_expires_at
        return Delivery(
            delivery=n, at=now, worker_id=worker_id, reason=DeliveryReason.LEASE_EXPIRED,
            previous_owner=rec.lease_owner,
            detail=f"its lease expired at {expired.isoformat()}" if expired is not None else "",
        )
    if rec.state.waiting:
        return Delivery(delivery=n, at=now, worker_id=worker_id, reason=DeliveryReason.WAKE,
                        detail=rec.state.value)
    if rec.deliveries == 0:
        return Delivery(delivery=n, at=now, worker_id=worker_id, reason=DeliveryReason.FIRST)
    return Delivery(delivery=n, at=now, worker_id=worker_id, reason=DeliveryReason.REQUEUED,
                    detail=rec.checkpoint.user_visible_status)


def _distinct(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _told(what: str, why: str) -> str:
    return f"{what} ({why})" if why else what


def delivery_summary(deliveries: int, history: Sequence[Delivery]) -> str:
    """``"3 deliveries: 1 first claim, 2 lease expired (worker a, worker b)"``.

    ``deliveries`` is the task's counter; deliveries it counts that ``history``
    lacks (claimed before the store recorded reasons) are said to be unrecorded.
    """
    noun = "delivery" if deliveries == 1 else "deliveries"
    by: dict[DeliveryReason, list[Delivery]] = {}
    for d in history:
        by.setdefault(d.reason, []).append(d)
    parts: list[str] = []
    for reason, items in sorted(by.items(), key=lambda kv: list(DeliveryReason).index(kv[0])):
        n, details = len(items), _distinct([d.detail for d in items])
        if reason is DeliveryReason.FIRST:
            parts.append(f"{n} first claim")
        elif reason is DeliveryReason.LEASE_EXPIRED:
            owners = _distinct([d.previous_owner or "" for d in items]) or ["unknown"]
            parts.append(f"{n} lease expired ({', '.join(f'worker {o}' for o in owners)})")
        elif reason is DeliveryReason.WAKE:
            parts.append(_told(f"{n} retry after a wait", ", ".join(details)))
        else:
            parts.append(_told(f"{n} requeued", "; ".join(details)))
    unrecorded = deliveries - len(history)
    if unrecorded > 0:
        parts.append(f"{unrecorded} not recorded (before this store kept delivery reasons)")
    return f"{deliveries} {noun}: {', '.join(parts)}" if parts else f"{deliveries} {noun}"
