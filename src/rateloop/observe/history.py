"""Each scope's history: the counts only the loop's events carry, and reading it back.

How it works.  The limiter writes a scope's admissions, units, limits and
pauses into its per-minute history itself, in the same step as the
admission (:mod:`rateloop.admission.history`, where the format is).  Three
counts are known only to the loop: a provider's refusal (``r``), an
admission wait and its seconds (``w``, ``ws``) and a fallback away from the
scope (``f``).  :func:`event_counts` picks them out of an event, told apart
by the metric sinks' own per-call rules (a refused attempt counted once,
under the route that refused).  Two sinks write them:

- :class:`~rateloop.observe.redis_events.RedisEventSink` (Redis), in the
  round trip it already makes for the event: no round trip of its own;
- :class:`HistorySink` (one process), into a
  :class:`~rateloop.admission.history.MemoryHistory` -- a memory limiter's
  own (``limiter.backend.history``).

:func:`read_redis_history` reads the last minutes of some scopes with one
pipelined ``HGETALL`` per scope and hour (two for the last 60 minutes): no scan.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from rateloop._clock import Clock
from rateloop.admission.backends.keys import history_key
from rateloop.admission.history import (
    HISTORY_TTL_SECONDS,
    MemoryHistory,
    ScopeHistory,
    check_minutes,
    hour_field,
    hour_of,
    hour_records,
    minute_of,
    scope_history,
)
from rateloop.observe._metrics import Metric, MetricSink
from rateloop.outcome.events import CapacityEvent, DecisionKind

__all__ = ["HistorySink", "event_counts", "history_writes", "read_redis_history"]

Counts = list[tuple[str, dict[str, float]]]


def event_counts(event: CapacityEvent, capacity: str | None) -> Counts:
    """``[(scope, {field: n})]``: what ``event`` adds to the history.

    ``capacity`` is the capacity decision the metric sinks counted for the
    event (``waited``, ``rejected_local``, ``rejected_remote`` or None).
    """
    out: Counts = []
    scope = event.scope
    if capacity == "waited" and scope:
        out.append((scope, {"w": 1.0, "ws": float(event.wait_seconds or 0.0)}))
    elif capacity == "rejected_remote" and (event.from_scope or scope):
        out.append((event.from_scope or scope or "", {"r": 1.0}))
    if event.decision is DecisionKind.FALLBACK and (event.from_scope or scope):
        out.append((event.from_scope or scope or "", {"f": 1.0}))
    return out


def history_writes(pipe: Any, prefix: str, counts: Counts, wall: float) -> None:
    """Queue ``counts`` for the minute of ``wall`` on a redis-py pipeline (no round trip).

    Each count is its own field of the scope's hour hash (``<minute>:<name>``),
    so ``HINCRBY`` adds it without reading the minute's record.
    """
    minute = minute_of(wall)
    hour = hour_of(minute)
    for scope, fields in counts:
        key = history_key(prefix, scope, hour)
        for name, n in fields.items():
            if float(n).is_integer():
                pipe.hincrby(key, hour_field(minute, name), int(n))
            else:
                pipe.hincrbyfloat(key, hour_field(minute, name), n)
        pipe.expireat(key, (hour + 1) * 3600 + HISTORY_TTL_SECONDS)


class HistorySink(MetricSink):
    """An event sink adding the loop's refusals, waits and fallbacks to a :class:`MemoryHistory`.

    For one process: pass the memory limiter's history
    (``HistorySink(limiter.backend.history)``).  With a shared Redis limiter
    use :class:`~rateloop.observe.redis_events.RedisEventSink`, which writes
    the same counts to Redis.
    """

    def __init__(self, history: MemoryHistory, *, clock: Clock | None = None) -> None:
        if not isinstance(history, MemoryHistory):
            raise TypeError(
                f"HistorySink needs a MemoryHistory (a memory limiter's "
                f"limiter.backend.history), got {history!r}"
            )
        self.history = history
        self._current = threading.local()  # this thread's event's capacity decision
        super().__init__(clock=clock)

    def __repr__(self) -> str:
        return f"HistorySink({self.history!r})"

    def _add(self, metric: Metric, labels: dict[str, str], n: float = 1.0) -> None:
        if metric.name == "capacity":
            self._current.capacity = labels["result"]

    def _record(self, metric: Metric, labels: dict[str, str], value: float) -> None:
        pass  # only the capacity decision is counted

    def __call__(self, event: CapacityEvent) -> None:
        self._current.capacity = None
        super().__call__(event)  # classifies the event (see _add)
        counts = event_counts(event, self._current.capacity)
        if counts:
            wall = self.clock.now().timestamp()
            for scope, fields in counts:
                self.history.add(scope, wall, fields)


def read_redis_history(
    client: Any, prefix: str, scopes: Iterable[str], minutes: int, now: float
) -> dict[str, ScopeHistory]:
    """The last ``minutes`` (the minute of ``now`` included) of each of ``scopes``.

    One pipelined ``HGETALL`` per scope and hour the window touches (1 or 2
    for up to 60 minutes, 25 for a day).
    """
    check_minutes(minutes)
    last = minute_of(now)
    first = last - minutes + 1
    hours = list(range(hour_of(first), hour_of(last) + 1))
    names = list(dict.fromkeys(scopes))
    pipe = client.pipeline(transaction=False)
    for scope in names:
        for hour in hours:
            pipe.hgetall(history_key(prefix, scope, hour))
    replies = pipe.execute()
    out: dict[str, ScopeHistory] = {}
    for i, scope in enumerate(names):
        rows = [
            (minute, record)
            for hour, fields in zip(
                hours, replies[i * len(hours) : (i + 1) * len(hours)], strict=True
            )
            for minute, record in hour_records(hour, fields)
            if first <= minute <= last
        ]
        out[scope] = scope_history(scope, rows)
    return out
