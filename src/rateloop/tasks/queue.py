"""The queue's rules, sans-IO: ordering with aging, and admission at submit.

How it works: every task gets a *rank* when it is submitted, ``created_at``
plus its class's offset (safety 0 s, interactive 30 s, scheduled 300 s,
background 1800 s by default).  Workers take the ready task with the lowest
rank.  A class is therefore always served before a later one submitted at
the same time, and a background task that has waited ``1800 s`` ranks with an
interactive task submitted now: aging is built into one indexed column, so
background work cannot starve forever.

Admission at submit, in order:

1. the queue holds ``max_depth`` unfinished tasks → ``rejected`` (queue full);
2. the earliest possible start — ``not_before``, or now, plus the estimated
   wait behind the tasks ranked ahead (``ahead * service_secs / workers``) —
   is past the task's deadline → ``rejected``;
3. that estimated delay is longer than ``max_delay_secs`` → ``rejected``;
4. otherwise the task is queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rateloop.errors import ConfigError
from rateloop.tasks.states import PriorityClass

__all__ = ["QueuePolicy", "SubmitVerdict", "admit_submit"]

_DEFAULT_OFFSETS = {
    PriorityClass.SAFETY: 0.0,
    PriorityClass.INTERACTIVE: 30.0,
    PriorityClass.SCHEDULED: 300.0,
    PriorityClass.BACKGROUND: 1800.0,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePolicy:
    """How big the queue may grow, how it orders work, and how long a lease lasts."""

    max_depth: int = 10_000
    max_delay_secs: float | None = None
    service_secs: float = 0.0  # estimated time a task holds a worker (0: no estimate)
    workers: int = 1
    offsets: dict[PriorityClass, float] = field(default_factory=lambda: dict(_DEFAULT_OFFSETS))
    lease_secs: float = 30.0
    max_deliveries: int = 20  # the task's retry budget: wakes and redeliveries

    def __post_init__(self) -> None:
        def bad(key: str, value: object, allowed: str) -> ConfigError:
            return ConfigError(
                f"{value!r} is not allowed", key=f"tasks.{key}", value=value, allowed=allowed
            )

        if self.max_depth < 1:
            raise bad("max_depth", self.max_depth, "an integer >= 1")
        if self.max_delay_secs is not None and self.max_delay_secs < 0:
            raise bad("max_delay_secs", self.max_delay_secs, "seconds >= 0 or None")
        if self.service_secs < 0:
            raise bad("service_secs", self.service_secs, "seconds >= 0")
        if self.workers < 1:
            raise bad("workers", self.workers, "an integer >= 1")
        if self.lease_secs <= 0:
            raise bad("lease_secs", self.lease_secs, "seconds > 0")
        if self.max_deliveries < 1:
            raise bad("max_deliveries", self.max_deliveries, "an integer >= 1")
        missing = set(PriorityClass) - set(self.offsets)
        if missing:
            raise bad("offsets", self.offsets, f"an offset for every class (missing {missing})")

    def rank(self, created_at: datetime, priority: PriorityClass) -> float:
        """The ordering key: lower runs first (epoch seconds plus the class offset)."""
        return created_at.timestamp() + self.offsets[priority]

    @property
    def heartbeat_secs(self) -> float:
        return self.lease_secs / 3


@dataclass(frozen=True, slots=True)
class SubmitVerdict:
    accepted: bool
    reason: str
    earliest_start: datetime


def admit_submit(
    policy: QueuePolicy,
    *,
    now: datetime,
    depth: int,
    ahead: int,
    not_before: datetime | None,
    deadline: datetime | None,
) -> SubmitVerdict:
    """Accept or reject a task at submit (the rules in the module docstring).

    >>> from datetime import UTC, datetime, timedelta
    >>> now = datetime(2026, 1, 1, tzinfo=UTC)
    >>> admit_submit(QueuePolicy(max_depth=2), now=now, depth=2, ahead=0,
    ...              not_before=None, deadline=None).reason
    'queue full: 2 unfinished tasks, max_depth 2'
    >>> admit_submit(QueuePolicy(), now=now, depth=0, ahead=0,
    ...              not_before=now + timedelta(hours=1),
    ...              deadline=now + timedelta(minutes=5)).accepted
    False
    """
    start = max(now, not_before) if not_before is not None else now
    delay = ahead * policy.service_secs / policy.workers
    earliest = start + timedelta(seconds=delay)
    if depth >= policy.max_depth:
        return SubmitVerdict(
            False, f"queue full: {depth} unfinished tasks, max_depth {policy.max_depth}", earliest
        )
    if deadline is not None and earliest > deadline:
        return SubmitVerdict(
            False,
            f"the earliest start {earliest.isoformat()} is past the deadline "
            f"{deadline.isoformat()}",
            earliest,
        )
    waited = (earliest - now).total_seconds()
    if policy.max_delay_secs is not None and waited > policy.max_delay_secs:
        return SubmitVerdict(
            False,
            f"the estimated delay {waited:.0f}s is over "
            f"max_delay_secs {policy.max_delay_secs:.0f}s",
            earliest,
        )
    return SubmitVerdict(True, "queued", earliest)
