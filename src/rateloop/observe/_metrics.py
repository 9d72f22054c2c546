"""What the metric sinks measure, written once for OpenTelemetry and Prometheus.

How it works.  A metric sink is an ordinary event sink (``(CapacityEvent) ->
None``, see :mod:`rateloop.outcome.events`).  :class:`MetricSink` turns the stream of
events into measurements and hands each one to two hooks a backend
implements: ``_add(metric, labels, n)`` for counters and ``_record(metric,
labels, value)`` for histograms.  OpenTelemetry also gets one span per
attempt (``_span``).  The rules, in order:

1. Every event counts once in ``decisions`` by its decision and signal kind.
2. Capacity decisions: an ``admission_wait`` is a local wait (``waited``); a
   stop while the call is being admitted (before its first attempt, or after
   a ``retry``, ``fallback`` or ``admission_wait``) is a local rejection; the
   first event about an attempt that the provider refused (a ``wait``,
   ``fallback``, ``skip`` or ``stop`` carrying a non-ok signal) is a remote
   rejection -- once per attempt, however many events follow it -- labelled,
   like the attempt's span, with the route refused (a fallback's ``from_*``).  A stop
   with status ``waiting_for_capacity``, local or remote, is a deadline miss
   caused by a capacity wait.
3. Waits: each ``wait`` / ``admission_wait`` records its scheduled seconds.
   The actual wait is measured on the sink's clock from that event to the
   call's next event when the next event follows the sleep directly (a
   ``retry`` or ``fallback`` after a ``wait``; another ``admission_wait`` or
   a ``stop`` after an ``admission_wait``).
4. A terminal event (``stop``, ``success_after_retry``) records the call's
   attempts by layer (``loop``, ``sdk``); :meth:`MetricSink.observe_outcome`
   records any :class:`~rateloop.Outcome`, including the first-try
   successes that emit no event.
5. A span per attempt: it opens at the event that starts the attempt (the
   ``retry``/``fallback`` before it, or its first ``admission_wait``) and
   ends at the event that ends it; a first attempt with no event before it
   starts at its first event.  Waits and the other decisions are span events.
6. A loop that calls the optional sink hooks ``call_started(scope,
   operation=..., priority=...)`` and ``call_finished(outcome)`` around every
   call gives the first attempt its real start, a first-try success its span
   and its operation and priority labels, and every call its count (then
   counted from ``call_finished`` only, never from terminal events too).
7. A ``pause`` event (the loop paused a scope on the shared limiter) counts in
   ``pauses`` and records its length in ``pause_length``, labelled with the
   paused scope; it is a span event of the attempt that caused it and leaves
   the wait measurements alone.

Events from concurrent calls interleave; a call's events all come from the
thread (sync) or asyncio task (async) that runs it, so that identity keys
the per-call state (a call made from inside another call's attempt, on the
same thread or task, shares it: rare, and only its spans suffer).  At most
:data:`MAX_OPEN_CALLS` calls are tracked; the oldest is ended as unfinished
beyond that (without the hooks, a call that waited for admission and then
succeeded at once emits no last event).

Labels are identifiers only -- provider, operation, model, scope, tenant,
priority (and the decision, signal kind, status or layer of a metric) --
never a reason, a prompt, a request body or a key.  ``tenant`` is the fourth
part of the scope key; ``priority`` is the call's admission priority, from
the event or ``call_started`` (see docs/observe.md).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from rateloop._clock import Clock, epoch_ns, system_clock
from rateloop._redact import redact
from rateloop.observe._calls import Attempt, Call, CallEnd, call_key
from rateloop.outcome.events import CapacityEvent, DecisionKind
from rateloop.outcome.record import Outcome

__all__ = [
    "BASE_LABELS",
    "METRICS",
    "WAIT_BUCKETS",
    "Metric",
    "MetricSink",
    "labels_of",
]

BASE_LABELS = ("provider", "operation", "model", "scope", "tenant", "priority")
#: Seconds: provider waits run from a fraction of a second to a day window's reset.
WAIT_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0, 86400.0)
ATTEMPT_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0)
MAX_OPEN_CALLS = 1024


@dataclass(frozen=True, slots=True)
class Metric:
    """One instrument: its name (without a unit suffix), kind, unit and extra labels."""

    name: str
    kind: Literal["counter", "histogram"]
    description: str
    unit: str = ""
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        return BASE_LABELS + self.labels


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "decisions",
            "counter",
            "Capacity-decision events of the RATE loop, by decision and signal kind.",
            labels=("decision", "signal_kind"),
        ),
        Metric(
            "capacity",
            "counter",
            "Capacity decisions: waited (local admission wait), rejected_local "
            "(admission refused the call), rejected_remote (the provider refused an attempt).",
            labels=("result",),
        ),
        Metric(
            "wait_scheduled",
            "histogram",
            "Waits the loop scheduled, by wait kind (provider or admission).",
            unit="seconds",
            labels=("wait_kind",),
            buckets=WAIT_BUCKETS,
        ),
        Metric(
            "wait_actual",
            "histogram",
            "Waits as measured between the wait and the call's next event.",
            unit="seconds",
            labels=("wait_kind",),
            buckets=WAIT_BUCKETS,
        ),
        Metric(
            "pauses",
            "counter",
            "Scopes paused on the shared limiter after a refusal with a server minimum.",
        ),
        Metric(
            "pause_length",
            "histogram",
            "How long each pause holds its scope, from the refusal to the pause's end.",
            unit="seconds",
            buckets=WAIT_BUCKETS,
        ),
        Metric("retries", "counter", "Retries of the same target after a wait."),
        Metric("fallbacks", "counter", "Fallbacks taken, labelled with the route fallen back to."),
        Metric(
            "fallback_rejections",
            "counter",
            "Fallback targets skipped because a check refused them.",
        ),
        Metric(
            "unknown_outcomes",
            "counter",
            "Writes whose effect is unknown (needs_operator, unknown_outcome).",
        ),
        Metric(
            "capacity_deadline_misses",
            "counter",
            "Calls stopped because capacity would come only after their deadline or budget.",
        ),
        Metric(
            "calls",
            "counter",
            "Calls ended, by status (terminal events and observe_outcome).",
            labels=("status",),
        ),
        Metric(
            "cost",
            "counter",
            "What served calls cost, by the ladder rung they finished on (Outcome.cost_usd).",
            unit="usd",
            labels=("rung",),
        ),
        Metric(
            "call_attempts",
            "histogram",
            "Attempts per call by layer: loop (rateloop's own), sdk (retries inside an "
            "SDK), redeliveries (a task queue).",
            labels=("layer",),
            buckets=ATTEMPT_BUCKETS,
        ),
    )
}

_PROVIDER_WAIT = {DecisionKind.WAIT: "provider", DecisionKind.ADMISSION_WAIT: "admission"}
_REMOTE = (DecisionKind.WAIT, DecisionKind.FALLBACK, DecisionKind.SKIP, DecisionKind.STOP)
_LOCAL_STOP = ("rejected", "waiting_for_capacity")
_TERMINAL = (DecisionKind.STOP, DecisionKind.SUCCESS_AFTER_RETRY)


def _label(value: object) -> str:
    if value is None:
        return ""
    return _redacted(str(value))


@functools.lru_cache(maxsize=4096)
def _redacted(text: str) -> str:
    # Label values repeat (a handful of scopes and models): redact each once.
    return redact(text)[:200]


def _tenant(scope: str | None) -> str | None:
    if scope is None:
        return None
    parts = scope.split(":")
    return parts[3] if len(parts) >= 4 else None


def labels_of(event: CapacityEvent, **extra: object) -> dict[str, str]:
    """The base labels of ``event`` plus ``extra``; identifiers only, each redacted."""
    out = {
        "provider": _label(event.provider),
        "operation": _label(event.operation),
        "model": _label(event.model),
        "scope": _label(event.scope),
        # Read with getattr: an event that carries a tenant itself wins over the scope's.
        "tenant": _label(getattr(event, "tenant", None) or _tenant(event.scope)),
        "priority": _label(event.priority),
    }
    out.update({k: _label(v) for k, v in extra.items()})
    return out


def _source_labels(event: CapacityEvent, base: dict[str, str]) -> dict[str, str]:
    # A fallback or skip names its target; its signal and refused attempt are from_*'s.
    if event.from_scope is None:
        return base
    return {
        **base,
        "provider": _label(event.from_provider),
        "model": _label(event.from_model),
        "scope": _label(event.from_scope),
        "tenant": _label(_tenant(event.from_scope)),
    }


class MetricSink:
    """An event sink that measures; subclasses write the measurements to a backend."""

    #: Whether the backend takes spans (OpenTelemetry does, Prometheus does not).
    traces = False

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock = clock if clock is not None else system_clock
        self._calls: OrderedDict[tuple[int, int], Call] = OrderedDict()
        self._lock = threading.Lock()
        # Set once the loop calls call_started: it then calls call_finished for every
        # call, which counts the calls, so terminal events no longer do.
        self._hooked = False

    # -- the backend's hooks -------------------------------------------------------------

    def _add(self, metric: Metric, labels: dict[str, str], n: float = 1.0) -> None:
        raise NotImplementedError

    def _record(self, metric: Metric, labels: dict[str, str], value: float) -> None:
        raise NotImplementedError

    def _span(
        self, attempt: Attempt, end_ns: int, *, ok: bool, unfinished: bool, parent: Any
    ) -> None:
        """Emit the span of one finished attempt, a child of ``parent`` (the call's)."""

    def _call_span(self, start_ns: int) -> Any:
        """Open the span of one call, the parent of its attempts'; returns its handle."""

    def _end_call_span(self, span: Any, end_ns: int, ended: CallEnd) -> None:
        """End the span of one call (:meth:`_call_span`'s handle) as ``ended`` says."""

    # -- the sink protocol ------------------------------------------------------------------

    def __call__(self, event: CapacityEvent) -> None:
        base = labels_of(event)
        source = _source_labels(event, base)
        d = event.decision
        self._add(
            METRICS["decisions"],
            {**source, "decision": d.value, "signal_kind": _label(event.signal_kind)},
        )
        now_mono, now_ns = self.clock.monotonic(), epoch_ns(self.clock.now())
        key = call_key()
        call = self._enter(key, now_ns)
        if d is DecisionKind.PAUSE:
            self._add(METRICS["pauses"], base)
            if event.wait_seconds is not None:
                self._record(METRICS["pause_length"], base, event.wait_seconds)
            if self.traces and call.attempt is not None:
                attrs: dict[str, Any] = {"rateloop.decision": d.value}
                if event.paused_until is not None:
                    attrs["rateloop.paused_until"] = event.paused_until.isoformat()
                if event.wait_seconds is not None:
                    attrs["rateloop.pause.seconds"] = event.wait_seconds
                call.attempt.events.append(("rateloop.pause", attrs, now_ns))
            return
        self._measure_wait_end(call, d, now_mono)
        self._count(event, base, call)
        self._trace(event, base, call, now_ns)
        if d in _PROVIDER_WAIT and event.wait_seconds is not None:
            kind = _PROVIDER_WAIT[d]
            self._record(METRICS["wait_scheduled"], {**base, "wait_kind": kind}, event.wait_seconds)
            call.wait = (d, event.wait_seconds, now_mono, {**base, "wait_kind": kind})
        if d in _TERMINAL and not self._hooked:
            with self._lock:
                self._calls.pop(key, None)

    def _enter(self, key: tuple[int, int], now_ns: int) -> Call:
        """The state of the call running here, created when new (the oldest evicted)."""
        with self._lock:
            call = self._calls.pop(key, None) or Call()
            self._calls[key] = call  # most recently used last
            evicted = (
                self._calls.popitem(last=False)[1] if len(self._calls) > MAX_OPEN_CALLS else None
            )
        if evicted is not None:
            self._abandon(evicted, now_ns)
        return call

    def _end_attempt(self, call: Call, end_ns: int, *, ok: bool, unfinished: bool) -> None:
        if call.attempt is not None and self.traces:
            self._span(call.attempt, end_ns, ok=ok, unfinished=unfinished, parent=call.span)
        call.attempt = None

    def _end_call(self, call: Call, end_ns: int, ended: CallEnd) -> None:
        if call.span is not None and self.traces:
            self._end_call_span(call.span, end_ns, ended)
        call.span = None

    def _abandon(self, call: Call, now_ns: int) -> None:
        """End the spans of a call that will send nothing more (it raised, or was evicted)."""
        labels = call.attempt.labels if call.attempt is not None else {}
        self._end_attempt(call, now_ns, ok=False, unfinished=True)
        at, ended = call.ended or (now_ns, CallEnd(labels, "unfinished", 0, ok=False))
        self._end_call(call, at, ended)

    # -- the loop's optional hooks (a loop that has them calls them around every call) --------

    def call_started(self, scope: str, *, operation: str = "", priority: str = "") -> None:
        """A call begins here: its first attempt's span starts now."""
        self._hooked = True
        now_ns = epoch_ns(self.clock.now())
        key = call_key()
        with self._lock:
            stale = self._calls.pop(key, None)  # a call here that never finished (it raised)
        if stale is not None:
            self._abandon(stale, now_ns)
        call = self._enter(key, now_ns)
        call.operation, call.priority = operation, priority
        call.attempt = Attempt(1, now_ns, True, {"scope": _label(scope)})
        if self.traces:
            call.span = self._call_span(now_ns)

    def call_finished(self, outcome: Outcome) -> None:
        """A call ended: count it (first-try successes included) and end its last span."""
        now_ns = epoch_ns(self.clock.now())
        with self._lock:
            call = self._calls.pop(call_key(), None)
        first = outcome.events[0] if outcome.events else None
        operation = first.operation if first is not None else (call.operation if call else "")
        priority = (first.priority if first is not None else None) or (
            call.priority if call else ""
        )
        self.observe_outcome(outcome, operation=operation, priority=priority or "")
        if call is None:
            return
        labels = _route_labels(outcome, operation, priority or "")
        if call.attempt is not None and len(call.attempt.labels) == 1 and outcome.route:
            call.attempt.labels = labels  # no event named it
        self._end_attempt(call, now_ns, ok=outcome.ok, unfinished=False)
        ended = CallEnd(labels, outcome.status.value, outcome.attempts.loop, outcome.ok, outcome)
        self._end_call(call, now_ns, ended)

    def observe_outcome(self, outcome: Outcome, *, operation: str = "", priority: str = "") -> None:
        """Record a finished call from its :class:`~rateloop.Outcome`.

        The events of a call do not include a first-try success; call this
        for every outcome to count calls by status and attempts by layer.
        Do not also pass the terminal events of the same calls to the sink
        (they would count twice): use either the sink or this, per call.  A
        loop that calls the sink's ``call_finished`` hook does this itself.
        """
        base = _route_labels(outcome, operation, priority)
        self._add(METRICS["calls"], {**base, "status": outcome.status.value})
        if outcome.cost_usd:
            self._add(METRICS["cost"], {**base, "rung": outcome.rung or ""}, outcome.cost_usd)
        a = outcome.attempts
        for layer, n in (("loop", a.loop), ("sdk", a.sdk), ("redeliveries", a.redeliveries)):
            self._record(METRICS["call_attempts"], {**base, "layer": layer}, float(n))

    # -- the rules ---------------------------------------------------------------------------------

    def _measure_wait_end(self, call: Call, d: DecisionKind, now_mono: float) -> None:
        if call.wait is None:
            return
        kind, _, started, labels = call.wait
        call.wait = None
        follows = (
            d in (DecisionKind.RETRY, DecisionKind.FALLBACK)
            if kind is DecisionKind.WAIT
            else d in (DecisionKind.ADMISSION_WAIT, DecisionKind.STOP)
        )
        if follows:
            self._record(METRICS["wait_actual"], labels, max(0.0, now_mono - started))

    def _count(self, event: CapacityEvent, base: dict[str, str], call: Call) -> None:
        d = event.decision
        remote = event.signal_kind not in (None, "ok")
        local_stop = d is DecisionKind.STOP and event.attempt in (0, call.admitting_at)
        if d is DecisionKind.ADMISSION_WAIT:
            self._add(METRICS["capacity"], {**base, "result": "waited"})
        elif local_stop and event.status in _LOCAL_STOP:
            self._add(METRICS["capacity"], {**base, "result": "rejected_local"})
        elif d in _REMOTE and remote and event.attempt not in call.refused:
            call.refused.add(event.attempt)
            source = _source_labels(event, base)  # the route that refused, not the fallback
            self._add(METRICS["capacity"], {**source, "result": "rejected_remote"})
        if d in (DecisionKind.RETRY, DecisionKind.FALLBACK, DecisionKind.ADMISSION_WAIT):
            call.admitting_at = event.attempt
        if d is DecisionKind.RETRY:
            self._add(METRICS["retries"], base)
        elif d is DecisionKind.FALLBACK:
            self._add(METRICS["fallbacks"], base)
        elif d is DecisionKind.SKIP:
            self._add(METRICS["fallback_rejections"], base)
        if d is DecisionKind.STOP:
            if event.status == "needs_operator" and (event.reason or "").startswith(
                "unknown_outcome"
            ):
                self._add(METRICS["unknown_outcomes"], base)
            if event.status == "waiting_for_capacity":
                self._add(METRICS["capacity_deadline_misses"], base)
        if d in _TERMINAL and not self._hooked:
            self._add(METRICS["calls"], {**base, "status": _label(event.status or "completed")})
            for layer, n in (("loop", event.attempt), ("sdk", event.sdk_attempts)):
                self._record(METRICS["call_attempts"], {**base, "layer": layer}, float(n))

    def _trace(self, event: CapacityEvent, base: dict[str, str], call: Call, now_ns: int) -> None:
        if not self.traces:
            return
        d = event.decision
        current = call.attempt
        # An admission wait (numbered with the attempts made so far) precedes the next
        # attempt; so does a stop from admission, which ends the attempt it refused.
        ahead = d is DecisionKind.ADMISSION_WAIT or (
            d is DecisionKind.STOP
            and current is not None
            and current.start_known
            and current.number == event.attempt + 1
        )
        number = event.attempt + 1 if ahead else event.attempt
        source = _source_labels(event, base)  # the attempt this event ends is on this route
        if current is None or current.number != number:
            if current is not None:  # an attempt that ended without its own event
                self._end_attempt(call, now_ns, ok=False, unfinished=True)
            current = call.attempt = Attempt(number, now_ns, False, source)
        if call.span is None:  # no call_started: the call starts with its first event
            call.span = self._call_span(current.start_ns)
        elif len(current.labels) == 1:  # opened by call_started: now the event names it
            current.labels = source
        attrs: dict[str, Any] = {"rateloop.decision": d.value}
        if event.wait_seconds is not None:
            attrs["rateloop.wait.scheduled_seconds"] = event.wait_seconds
        if event.next_attempt_at is not None:
            attrs["rateloop.next_attempt_at"] = event.next_attempt_at.isoformat()
        if event.status is not None:
            attrs["rateloop.status"] = event.status
        name = "rateloop.wait" if d in _PROVIDER_WAIT else f"rateloop.{d.value}"
        current.events.append((name, attrs, now_ns))
        if event.signal_kind not in (None, "ok") and d is not DecisionKind.ADMISSION_WAIT:
            current.signal_kind = event.signal_kind
            current.http_status = event.http_status
        if d in (DecisionKind.RETRY, DecisionKind.FALLBACK):
            self._end_attempt(call, now_ns, ok=False, unfinished=False)
            call.attempt = Attempt(number + 1, now_ns, True, base)
        elif d in _TERMINAL:
            ok = d is DecisionKind.SUCCESS_AFTER_RETRY
            self._end_attempt(call, now_ns, ok=ok, unfinished=False)
            ended = CallEnd(base, event.status or "completed", event.attempt, ok)
            if self._hooked:  # call_finished ends the call with its outcome, unless it raised
                call.ended = (now_ns, ended)
            else:
                self._end_call(call, now_ns, ended)


def _route_labels(outcome: Outcome, operation: str, priority: str) -> dict[str, str]:
    route = outcome.route
    return {
        "provider": _label(route.provider if route is not None else None),
        "operation": _label(operation),
        "model": _label(route.model if route is not None else None),
        "scope": _label(route.scope if route is not None else None),
        "tenant": _label(route.tenant if route is not None else None),
        "priority": _label(priority),
    }
