"""The queue: DBOS's ``limiter`` and ``global_concurrency`` from the limits rateloop knows.

DBOS (3.x) keeps a registered queue's configuration in the system database and every worker
re-reads it on each poll, so :func:`refresh_queue` reaches every process at its next poll.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

from dbos import DBOS, Queue

from rateloop.admission import LimitSpec
from rateloop.policy import Policy
from rateloop.route import Route

__all__ = [
    "KnowsLimits",
    "QueueLimits",
    "QueueRateLimit",
    "queue_limits",
    "refresh_queue",
    "refresh_queue_async",
    "register_queue",
]


class QueueRateLimit(TypedDict):
    """DBOS's queue ``limiter``: at most ``limit`` workflow starts in any ``period`` seconds."""

    limit: int
    period: float


class KnowsLimits(Protocol):
    """What :func:`queue_limits` reads of a limiter: the limits in force in a scope."""

    def limits_for(self, scope: str) -> LimitSpec | None: ...


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A DBOS queue's ``limiter`` and ``global_concurrency``, from rateloop's limits.

    ``scope`` names the scope whose rate binds (None: no rate is known).
    """

    limiter: QueueRateLimit | None
    global_concurrency: int | None
    scope: str | None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``DBOS.register_queue``."""
        return {"limiter": self.limiter, "global_concurrency": self.global_concurrency}


_DAY_SECS = 86_400.0


def _window(spec: LimitSpec, share: float, calls: int) -> tuple[float, int, float] | None:
    """(workflows a second, limit, period) of one scope's request limits, or None."""
    if spec.requests_per_minute is not None:
        # The sustained rate, about a second at a time (``limit`` starts every ``limit / rate``
        # seconds, at least one second: DBOS polls a queue about once a second), not the
        # provider's bucket (``burst``): a workflow the queue holds back waits ENQUEUED and
        # holds nothing, while one started in a burst waits for admission inside its step.
        rate = spec.requests_per_minute * share / 60.0 / calls
        limit = max(1, math.ceil(rate - 1e-9))
        return rate, limit, math.ceil(limit / rate * 1000 - 1e-6) / 1000
    if spec.requests_per_day is not None:  # a count, not a pace: a rolling day
        limit = max(1, math.floor(spec.requests_per_day * share / calls))
        return limit / _DAY_SECS, limit, _DAY_SECS
    return None


def queue_limits(known: Policy | KnowsLimits, route: Route, *, calls_per_workflow: int = 1,
                 share: float = 1.0) -> QueueLimits:
    """The queue limits that keep ``route`` within what ``known`` says of it.

    ``known`` is a :class:`~rateloop.Policy` (its configured ``[limits]``) or a
    :class:`~rateloop.admission.Limiter` (``limits_for``: configured, else learned).  Every
    scope of the route counts and the tightest binds.  The request rate becomes the
    limiter: ``limit`` starts per ``period``, about a second's requests (one start per
    ``1/rate`` seconds below one a second); without a per-minute limit, the day's requests
    per rolling day.
    ``calls_per_workflow``: model calls each workflow of the queue makes; ``share``: the
    fraction of the route's limits this queue may use (0 < share <= 1).
    """
    if isinstance(calls_per_workflow, bool) or not isinstance(calls_per_workflow, int) or (
        calls_per_workflow < 1
    ):
        raise ValueError(f"calls_per_workflow must be an int >= 1, got {calls_per_workflow!r}")
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
        raise ValueError(f"share must be a fraction 0 < share <= 1, got {share!r}")
    if not isinstance(route, Route):
        raise TypeError(f"route must be a rateloop.Route, got {route!r}")
    if isinstance(known, Policy):
        limits = known.limits

        def lookup(scope: str) -> LimitSpec | None:
            return limits.get(scope)
    elif callable(getattr(known, "limits_for", None)):
        lookup = known.limits_for
    else:
        raise TypeError(f"known must be a rateloop.Policy or a Limiter, got {known!r}")
    best: tuple[float, int, float] | None = None
    scope_of_best: str | None = None
    concurrency: int | None = None
    for scope in route.scopes:
        spec = lookup(scope)
        if spec is None:
            continue
        window = _window(spec, share, calls_per_workflow)
        if window is not None and (best is None or window[0] < best[0]):
            best, scope_of_best = window, scope
        if spec.concurrency is not None:
            mine = max(1, math.floor(spec.concurrency * share))
            concurrency = mine if concurrency is None else min(concurrency, mine)
    limiter: QueueRateLimit | None = (
        None if best is None else {"limit": best[1], "period": best[2]}
    )
    return QueueLimits(limiter, concurrency, scope_of_best)


def register_queue(name: str, limits: QueueLimits, **options: Any) -> Queue:
    """``DBOS.register_queue(name, ...)`` with ``limits``; ``options`` are DBOS's others
    (``worker_concurrency``, ``polling_interval_sec``, ...)."""
    if not isinstance(limits, QueueLimits):
        raise TypeError(f"limits must be a QueueLimits (from queue_limits()), got {limits!r}")
    clash = sorted({"limiter", "global_concurrency", "concurrency"} & set(options))
    if clash:
        raise TypeError(f"register_queue takes {', '.join(clash)} from limits=, not as options")
    return DBOS.register_queue(name, **limits.options(), **options)


def _changes(limits: QueueLimits, limiter: QueueRateLimit | None,
             concurrency: int | None) -> dict[str, Any]:
    if not isinstance(limits, QueueLimits):
        raise TypeError(f"limits must be a QueueLimits (from queue_limits()), got {limits!r}")
    changes: dict[str, Any] = {}
    if _rate_of(limiter) != _rate_of(limits.limiter):
        changes["limiter"] = limits.limiter
    if concurrency != limits.global_concurrency:
        changes["global_concurrency"] = limits.global_concurrency
    return changes


def _rate_of(limiter: QueueRateLimit | None) -> tuple[int, float] | None:
    return None if limiter is None else (int(limiter["limit"]), float(limiter["period"]))


def refresh_queue(queue: Queue, limits: QueueLimits) -> bool:
    """Write ``limits`` to a registered queue's row when they differ; True when changed.

    Every worker picks the new limits up at its next poll of the queue.
    """
    changes = _changes(limits, queue.limiter, queue.global_concurrency)
    if "limiter" in changes:
        queue.set_limiter(changes["limiter"])
    if "global_concurrency" in changes:
        queue.set_global_concurrency(changes["global_concurrency"])
    return bool(changes)


async def refresh_queue_async(queue: Queue, limits: QueueLimits) -> bool:
    """The asyncio twin of :func:`refresh_queue`."""
    changes = _changes(limits, await queue.get_limiter_async(),
                       await queue.get_global_concurrency_async())
    if "limiter" in changes:
        await queue.set_limiter_async(changes["limiter"])
    if "global_concurrency" in changes:
        await queue.set_global_concurrency_async(changes["global_concurrency"])
    return bool(changes)
