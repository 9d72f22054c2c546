"""Gauges of the live scope state (headroom, limits, pauses) for Prometheus and OpenTelemetry.

The event sinks count what the loop decided; these gauges show what the
shared limiter holds *now*, read from Redis at collection time through a
state reader (``reader.read() -> Snapshot``, e.g.
:class:`~rateloop.observe.redis_state.RedisStateReader`).  One read serves
every gauge of one collection.

Gauges (Prometheus names; OpenTelemetry uses ``rateloop.scope.<name>``):

- ``rateloop_scope_headroom{scope, dimension}``: units free now;
- ``rateloop_scope_capacity{scope, dimension}``: what may be in use at once;
- ``rateloop_scope_limit_configured{scope, dimension}``,
  ``rateloop_scope_limit_learned{scope, dimension}`` (from the provider's
  headers) and ``rateloop_scope_limit_effective{scope, dimension}`` (the
  governing limit x the AIMD factor, lowered by 429s despite admission);
- ``rateloop_scope_aimd_factor{scope}``, ``rateloop_scope_leases{scope}``;
- ``rateloop_scope_paused{scope}`` (0/1) and
  ``rateloop_scope_pause_remaining_seconds{scope}``;
- ``rateloop_scope_waiters{scope, priority}``: calls sleeping on the scope
  now, by priority, from the shared event stream
  (:mod:`rateloop.observe.waiters`; a scope with none has no series).

With a task store (``store=``), the queue too (``rateloop.queue.<name>``):

- ``rateloop_queue_tasks{state}``: tasks still to do by state (``queued``,
  ``running`` and the two waiting states, each always present: their sum is
  the depth);
- ``rateloop_queue_depth``: that sum;
- ``rateloop_queue_finished_tasks{state}``: tasks in the store that are done,
  by terminal state (``completed``, ``failed_retry_exhausted``, ...): kept
  apart so a queue's depth never counts them;
- ``rateloop_queue_oldest_age_seconds``: age of the oldest unfinished task;
- ``rateloop_queue_next_wakeup_seconds``: until the soonest parked task wakes;
- ``rateloop_queue_parked{priority}``: parked tasks by priority class.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from rateloop._clock import system_clock
from rateloop.observe.queue_state import UNFINISHED, QueueState, read_queue
from rateloop.observe.state import Snapshot

__all__ = [
    "GAUGES",
    "QUEUE_GAUGES",
    "ScopeStateCollector",
    "gauge_values",
    "observe_scope_state",
    "queue_values",
]

#: name -> (description, the label besides ``scope``, if any)
GAUGES: dict[str, tuple[str, str | None]] = {
    "headroom": ("Units free now in the scope's dimension.", "dimension"),
    "capacity": (
        "Units that may be in use at once (burst x limit, day limit, slots).",
        "dimension",
    ),
    "limit_configured": ("The limit as configured (per minute, per day, or slots).", "dimension"),
    "limit_learned": ("The limit learned from the provider's headers (zero-config).", "dimension"),
    "limit_effective": ("The configured limit scaled by the scope's AIMD factor.", "dimension"),
    "aimd_factor": ("The scope's AIMD factor (1 unless 429s despite admission lowered it).", None),
    "leases": ("Concurrency leases held now.", None),
    "paused": ("1 while the scope is paused for every worker.", None),
    "pause_remaining_seconds": ("Seconds until the scope's pause ends.", None),
    "waiters": ("Calls sleeping on the scope now before an attempt, by priority.", "priority"),
}


QUEUE_GAUGES: dict[str, tuple[str, str | None]] = {
    "tasks": ("Tasks still to do, by state (queued, running, waiting).", "state"),
    "depth": ("Tasks still to do: queued, running or waiting.", None),
    "finished_tasks": ("Tasks done, by terminal state (not in the depth).", "state"),
    "oldest_age_seconds": ("Age of the oldest unfinished task.", None),
    "next_wakeup_seconds": ("Seconds until the soonest parked task wakes.", None),
    "parked": ("Parked (waiting) tasks by priority class.", "priority"),
}


_LEARNED_DIMENSION = {
    "requests_per_minute": "requests",
    "input_tokens_per_minute": "input_tokens",
    "output_tokens_per_minute": "output_tokens",
    "tokens_per_minute": "tokens",
    "requests_per_day": "requests_per_day",
}


def queue_values(queue: QueueState) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every queue gauge's ``(labels, value)`` pairs."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in QUEUE_GAUGES}
    for state in UNFINISHED:
        out["tasks"].append(({"state": state}, float(queue.by_state.get(state, 0))))
    out["depth"].append(({}, float(queue.depth)))
    for state, n in sorted(queue.by_state.items()):
        if state not in UNFINISHED:
            out["finished_tasks"].append(({"state": state}, float(n)))
    if queue.oldest_age_secs is not None:
        out["oldest_age_seconds"].append(({}, queue.oldest_age_secs))
    wakes = [datetime.fromisoformat(t["retry_at"]) for t in queue.waiting if t["retry_at"]]
    if wakes:
        out["next_wakeup_seconds"].append(({}, max(0.0, (min(wakes) - queue.at).total_seconds())))
    by_priority: dict[str, int] = {}
    for t in queue.waiting:
        by_priority[t["priority"]] = by_priority.get(t["priority"], 0) + 1
    for priority, n in sorted(by_priority.items()):
        out["parked"].append(({"priority": priority}, float(n)))
    return out


def gauge_values(snap: Snapshot) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every gauge's ``(labels, value)`` pairs for one snapshot."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in GAUGES}
    for s in snap.scopes:
        scope = {"scope": s.scope}
        out["aimd_factor"].append((scope, s.factor))
        out["leases"].append((scope, float(s.leases)))
        out["paused"].append((scope, 1.0 if s.paused else 0.0))
        remaining = (s.paused_until - snap.at).total_seconds() if s.paused_until else 0.0
        out["pause_remaining_seconds"].append((scope, max(0.0, remaining)))
        for priority, n in s.waiters.items():
            out["waiters"].append(({"scope": s.scope, "priority": priority}, float(n)))
        for d in s.dimensions:
            labels = {"scope": s.scope, "dimension": d.dimension}
            out["headroom"].append((labels, d.headroom))
            out["capacity"].append((labels, d.capacity))
            if s.governed_by == "configured":
                out["limit_configured"].append((labels, float(d.configured)))
            out["limit_effective"].append((labels, d.effective))
        for name, value in sorted(s.learned.items()):
            dimension = _LEARNED_DIMENSION.get(name, name)
            out["limit_learned"].append(({"scope": s.scope, "dimension": dimension}, float(value)))
    return out


class _Cached:
    """One read of the reader per collection (gauges are collected one after another)."""

    def __init__(self, reader: Any, max_age: float, store: Any = None) -> None:
        self._reader = reader
        self._store = store
        self._max_age = max_age
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._values: dict[str, list[tuple[dict[str, str], float]]] = {}

    def values(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        with self._lock:
            now = system_clock.monotonic()
            if now - self._at > self._max_age:
                snap = self._reader.read()
                values = {f"scope.{k}": v for k, v in gauge_values(snap).items()}
                if self._store is not None:
                    queue = queue_values(read_queue(self._store, snap.at))
                    values.update({f"queue.{k}": v for k, v in queue.items()})
                self._values = values
                self._at = now
            return self._values


class ScopeStateCollector:
    """A Prometheus collector: ``registry.register(ScopeStateCollector(reader))``."""

    def __init__(self, reader: Any, *, store: Any = None, namespace: str = "rateloop") -> None:
        self._reader = reader
        self._store = store
        self.namespace = namespace

    def describe(self) -> list[Any]:
        return []  # collected lazily: registering must not read Redis

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        snap = self._reader.read()
        values = gauge_values(snap)
        for name, (doc, label) in GAUGES.items():
            labels = ["scope", label] if label else ["scope"]
            family = GaugeMetricFamily(f"{self.namespace}_scope_{name}", doc, labels=labels)
            for lv, v in values[name]:
                family.add_metric([lv[k] for k in labels], v)
            yield family
        if self._store is None:
            return
        queue = queue_values(read_queue(self._store, snap.at))
        for name, (doc, label) in QUEUE_GAUGES.items():
            names = [label] if label else []
            family = GaugeMetricFamily(f"{self.namespace}_queue_{name}", doc, labels=names)
            for lv, v in queue[name]:
                family.add_metric([lv[k] for k in names], v)
            yield family


def observe_scope_state(
    reader: Any, *, store: Any = None, meter_provider: Any = None, max_age: float = 1.0
) -> list[Any]:
    """Register OpenTelemetry observable gauges over ``reader`` (and ``store``).

    Returns the instruments.  The reader and the store are read at most once
    per ``max_age`` seconds, however many gauges a collection asks for.
    """
    from opentelemetry import metrics

    from rateloop._version import package_version

    meter = metrics.get_meter("rateloop", package_version(), meter_provider=meter_provider)
    cache = _Cached(reader, max_age, store)

    def callback(name: str) -> Callable[[Any], Iterable[Any]]:
        def observe(_options: Any) -> Iterable[Any]:
            return [
                metrics.Observation(v, {f"rateloop.{k}": x for k, x in labels.items()})
                for labels, v in cache.values().get(name, [])
            ]

        return observe

    docs = {f"scope.{n}": doc for n, (doc, _) in GAUGES.items()}
    if store is not None:
        docs.update({f"queue.{n}": doc for n, (doc, _) in QUEUE_GAUGES.items()})
    return [
        meter.create_observable_gauge(
            f"rateloop.{name}",
            callbacks=[callback(name)],
            unit="s" if name.endswith("seconds") else "1",
            description=doc,
        )
        for name, doc in docs.items()
    ]
