"""Share the loop's capacity events through a capped Redis stream, for the dashboard.

:class:`RedisEventSink` appends each event to the stream ``{prefix}events``
(``XADD ... MAXLEN ~ maxlen``), so the dashboard -- another process -- can
show every worker's waits, rejections and fallbacks on its timeline.  Only
the event's identifiers, kinds and numbers are written (the same safe fields
:class:`~rateloop.outcome.events.LoggingSink` logs, minus ids), plus ``capacity``:
the capacity decision the metric sinks count for the event (``waited``,
``rejected_local``, ``rejected_remote``), told apart with the same per-call
rules (:mod:`rateloop.observe._metrics`).

The notable events -- a decision in :data:`NOTABLE_DECISIONS`: pauses,
fallbacks, skips, stops -- are also appended, in the same round trip, to a
second capped stream ``{prefix}events:notable`` with its own ``notable_maxlen``:
an operator's events are rare and routine admissions many, so in one stream a
pause would be trimmed (and scroll off the dashboard) within seconds.  A
fallback or a skip carries the route the call was on (``from_provider``,
``from_model``, ``from_scope``), and its timeline entry says from which route
to which and why.

Each event of one call also carries ``call``: a random token the sink draws
when the loop starts the call (its ``call_started`` hook), so a reader can
tell calls apart -- the waiters by priority (:mod:`rateloop.observe.waiters`)
count each call once.  The token identifies nothing outside the stream.

The sink also adds what only the loop knows to each scope's per-minute
history (refusals, admission waits and their seconds, fallbacks: see
:mod:`rateloop.observe.history`) in the same round trip, minuted by this
process's clock; ``history=False`` leaves it out.

A sink must never break the call it observes: when Redis cannot be reached
the event is dropped and one warning is logged per minute.
"""

from __future__ import annotations

import logging
import secrets
import threading
from contextvars import ContextVar
from typing import Any

from rateloop._clock import system_clock
from rateloop._redact import redact_url
from rateloop._url import lower_scheme
from rateloop.admission.backends.keys import events_key, notable_events_key
from rateloop.observe._labels import safe_operation
from rateloop.observe._metrics import Metric, MetricSink
from rateloop.observe.history import event_counts, history_writes
from rateloop.outcome.events import CapacityEvent, DecisionKind

__all__ = [
    "FIELDS",
    "NOTABLE_DECISIONS",
    "RedisEventSink",
    "events_key",
    "notable_events_key",
    "timeline_entry",
]

log = logging.getLogger("rateloop.observe")

#: The event fields written to the stream.
FIELDS = (
    "decision",
    "operation",
    "provider",
    "model",
    "scope",
    "signal_kind",
    "http_status",
    "attempt",
    "wait_seconds",
    "next_attempt_at",
    "status",
    "reason",
    "priority",
    "from_provider",
    "from_model",
    "from_scope",
)
#: The decisions an operator looks for: also written to ``{prefix}events:notable``.
NOTABLE_DECISIONS: frozenset[str] = frozenset(
    {DecisionKind.PAUSE, DecisionKind.FALLBACK, DecisionKind.SKIP, DecisionKind.STOP}
)
_WARN_EVERY = 60.0
# The current call's token: the loop runs a call's hooks and events in one context
# (one thread, or one asyncio task), so concurrent calls never see each other's.
_CALL: ContextVar[str | None] = ContextVar("rateloop_event_call", default=None)


class RedisEventSink(MetricSink):
    """An event sink writing to the capped stream ``{prefix}events``.

    >>> RedisEventSink("redis://:pw@127.0.0.1:6379/0", prefix="app:")
    RedisEventSink('redis://:***@127.0.0.1:6379/0', key='app:events')

    ``maxlen`` caps the stream of every event, ``notable_maxlen`` the stream
    of the notable ones (both approximately, as ``MAXLEN ~``).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "rateloop:",
        maxlen: int = 1000,
        notable_maxlen: int = 200,
        socket_timeout: float = 1.0,
        history: bool = True,
    ) -> None:
        for name, value in (("maxlen", maxlen), ("notable_maxlen", notable_maxlen)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ImportError(
                "the Redis event sink needs redis-py: pip install 'rateloop[redis]'"
            ) from exc
        if not isinstance(history, bool):
            raise TypeError(f"history must be True or False, got {history!r}")
        self.history, self.prefix = history, prefix
        self._errors: tuple[type[Exception], ...] = (redis.RedisError,)
        self.url = redact_url(url)
        self.key = events_key(prefix)
        self.notable_key = notable_events_key(prefix)
        self.maxlen, self.notable_maxlen = maxlen, notable_maxlen
        # redis-py before 8 compares its schemes case-sensitively: the canonical spelling.
        self._client: Any = redis.Redis.from_url(
            lower_scheme(url), socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout
        )
        self._warned_at = -float("inf")
        self._current = threading.local()
        super().__init__()

    def __repr__(self) -> str:
        return f"RedisEventSink({self.url!r}, key={self.key!r})"

    def _add(self, metric: Metric, labels: dict[str, str], n: float = 1.0) -> None:
        if metric.name == "capacity":
            self._current.capacity = labels["result"]

    def _record(self, metric: Metric, labels: dict[str, str], value: float) -> None:
        pass  # only the capacity decision goes to the stream

    def call_started(self, scope: str, *, operation: str = "", priority: str = "") -> None:
        """A call begins: draw the token that tags its events."""
        _CALL.set(secrets.token_hex(8))
        super().call_started(scope, operation=operation, priority=priority)

    def __call__(self, event: CapacityEvent) -> None:
        self._current.capacity = None
        super().__call__(event)  # classifies the event (see _add)
        data = event.to_dict()
        fields = {k: str(data[k]) for k in FIELDS if k in data}
        if fields.get("operation"):  # the caller's free text: a safe token or "other"
            fields["operation"] = safe_operation(fields["operation"])
        if self._current.capacity is not None:
            fields["capacity"] = self._current.capacity
        call = _CALL.get()
        if call is not None:
            fields["call"] = call
        try:
            # One round trip for both streams: the hot path pays no extra call.
            pipe = self._client.pipeline(transaction=False)
            pipe.xadd(self.key, fields, maxlen=self.maxlen, approximate=True)
            if fields["decision"] in NOTABLE_DECISIONS:
                pipe.xadd(self.notable_key, fields, maxlen=self.notable_maxlen, approximate=True)
            if self.history:
                counts = event_counts(event, self._current.capacity)
                history_writes(pipe, self.prefix, counts, system_clock.now().timestamp())
            pipe.execute()
        except self._errors as exc:
            now = system_clock.monotonic()
            if now - self._warned_at >= _WARN_EVERY:
                self._warned_at = now
                log.warning("rateloop: dropping events, Redis at %s failed: %s", self.url, exc)

    def close(self) -> None:
        self._client.close()


def _route(provider: str | None, model: str | None, scope: str | None) -> str:
    return f"{provider}:{model}" if provider and model else scope or "?"


def timeline_entry(at: str, fields: dict[str, str]) -> dict[str, Any]:
    """A dashboard timeline entry for one event read back from the stream.

    A fallback or skip names the route it left and the one it went to, and why:

    >>> timeline_entry("t", {"decision": "fallback", "provider": "anthropic",
    ...     "model": "claude-x", "scope": "anthropic:claude-x", "from_provider": "openai",
    ...     "from_model": "gpt-5", "from_scope": "openai:gpt-5", "signal_kind": "temporary",
    ...     "http_status": "429"})["text"]
    'fallback openai:gpt-5 → anthropic:claude-x (temporary, HTTP 429)'
    """
    decision = fields.get("decision", "?")
    signal = fields.get("signal_kind")
    status = fields.get("status")
    kind = fields.get("capacity") or decision
    why = [signal] if signal else []
    if fields.get("http_status"):
        why.append(f"HTTP {fields['http_status']}")
    extra: dict[str, Any] = {}
    if fields.get("from_scope") or fields.get("from_provider"):
        # The refusal belongs to the route left: say which, then where the call went.
        get = fields.get
        left = _route(get("from_provider"), get("from_model"), get("from_scope"))
        went = _route(get("provider"), get("model"), get("scope"))
        parts = [decision, left, "→", went]
        if why:
            parts.append(f"({', '.join(why)})")
        extra = {"from": fields.get("from_scope", left), "to": fields.get("scope", went)}
    else:
        parts = [decision, *why]
    if fields.get("wait_seconds"):
        parts.append(f"wait {float(fields['wait_seconds']):.1f}s")
    if status:
        parts.append(f"-> {status}")
    return {
        "at": at,
        "kind": kind,
        "scope": fields.get("scope", ""),
        "text": " ".join(parts),
        "decision": decision,
        "notable": decision in NOTABLE_DECISIONS,
        **extra,
    }
