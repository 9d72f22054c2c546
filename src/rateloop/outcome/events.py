"""Capacity-decision events and their sinks.

The RATE loop emits one :class:`CapacityEvent` per decision: each wait, retry,
fallback, skip, admission wait, stop, and success after a retry.  A plain
first-try success is not an event (it is the normal case; the ``Outcome``
says it).

Events carry identifiers, kinds, codes and numbers only.  They never carry a
prompt, a call's arguments, an exception's message or an API key: the loop
builds them from the normalized signal, and :func:`_safe_token` keeps the few
provider-supplied strings (error code, request id) to a short token alphabet.

Sinks are plain callables ``(CapacityEvent) -> None``; :class:`LoggingSink`
writes JSON lines to the stdlib logger ``rateloop.outcome.events`` (for machines),
:class:`ConsoleSink` a few rate-limited lines for a person at a terminal.
A sink may also define ``call_started(scope)`` and ``call_finished(outcome)``:
the loop calls them around every call (a first-try success included), which
is how :class:`ConsoleSink` counts calls in flight.  Both are optional, so
any plain callable remains a sink.  A ``call_started`` that accepts the
keywords ``operation`` and ``priority`` (or ``**kwargs``) gets them too.

``provider``, ``model`` and ``scope`` name the route the decision is about;
a ``fallback`` names the route fallen back to and a ``skip`` the route
skipped.  Those two also carry ``from_provider``, ``from_model`` and
``from_scope``: the route the call was on, whose attempt produced the
event's signal, so a refusal is never blamed on the route that follows it.

A ``pause`` event says the loop paused a scope on the shared limiter after a
refusal with a server minimum: ``scope`` is the paused scope, ``wait_seconds``
the pause's length, ``paused_until`` its end, ``reason`` the refusal's kind.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from rateloop._redact import redact

if TYPE_CHECKING:
    from rateloop.signal import LimitSignal

__all__ = [
    "CapacityEvent",
    "DecisionKind",
    "EventSink",
    "LoggingSink",
    "RecordingSink",
    "redact",
    "signal_fields",
]

EventSink = Callable[["CapacityEvent"], None]

_TOKEN = re.compile(r"[^A-Za-z0-9_.:/\-]")


def _safe_token(value: str | None, limit: int = 96) -> str | None:
    """Keep provider-supplied identifiers to a short, inert token with no key in it."""
    if value is None:
        return None
    return redact(_TOKEN.sub("_", value))[:limit]


class DecisionKind(StrEnum):
    """What the loop decided (the ``decision`` field of an event)."""

    WAIT = "wait"
    RETRY = "retry"
    FALLBACK = "fallback"
    SKIP = "skip"
    ADMISSION_WAIT = "admission_wait"
    STOP = "stop"
    SUCCESS_AFTER_RETRY = "success_after_retry"
    PAUSE = "pause"


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityEvent:
    """One decision of the RATE loop, safe to log."""

    decision: DecisionKind
    operation: str
    task_id: str | None = None
    run_id: str | None = None
    provider: str | None = None
    model: str | None = None
    scope: str | None = None
    signal_kind: str | None = None
    http_status: int | None = None
    provider_code: str | None = None
    request_id: str | None = None
    retry_after_seconds: float | None = None
    reset_at: datetime | None = None
    attempt: int = 0
    sdk_attempts: int = 0
    wait_seconds: float | None = None
    next_attempt_at: datetime | None = None
    deadline: datetime | None = None
    status: str | None = None
    reason: str | None = None
    priority: str | None = None
    paused_until: datetime | None = None
    # The route the call was on when it fell back or skipped (it produced the signal).
    from_provider: str | None = None
    from_model: str | None = None
    from_scope: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "provider_code", _safe_token(self.provider_code))
        object.__setattr__(self, "request_id", _safe_token(self.request_id))
        for name in ("reason", "task_id", "run_id", "operation", "priority"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, redact(value))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: datetimes in ISO 8601, unset fields omitted."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if value is None:
                continue
            if isinstance(value, datetime):
                out[key] = value.isoformat()
            elif isinstance(value, StrEnum):
                out[key] = value.value
            else:
                out[key] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def signal_fields(signal: LimitSignal | None) -> dict[str, Any]:
    """The fields of an event that come from the signal behind the decision."""
    if signal is None:
        return {}
    return {
        "signal_kind": signal.kind.value,
        "http_status": signal.status,
        "provider_code": signal.code,
        "request_id": signal.request_id,
        "retry_after_seconds": signal.retry_after,
        "reset_at": signal.reset_at,
    }


class LoggingSink:
    """Write each event to a stdlib logger, as one JSON line by default.

    ``fmt="json"`` logs the JSON object as the message; ``fmt="text"`` logs a
    short ``key=value`` line.  The event is also attached to the record as
    ``record.capacity_event`` for structured handlers.
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        level: int = logging.INFO,
        fmt: str = "json",
    ) -> None:
        if fmt not in ("json", "text"):
            raise ValueError(f"LoggingSink fmt must be 'json' or 'text', got {fmt!r}")
        self.logger = logger or logging.getLogger("rateloop.events")
        self.level = level
        self.fmt = fmt

    def __call__(self, event: CapacityEvent) -> None:
        if not self.logger.isEnabledFor(self.level):
            return
        if self.fmt == "json":
            message = event.to_json()
        else:
            message = " ".join(f"{k}={v}" for k, v in event.to_dict().items())
        self.logger.log(self.level, message, extra={"capacity_event": event})

    def __repr__(self) -> str:
        return f"LoggingSink(logger={self.logger.name!r}, fmt={self.fmt!r})"


class RecordingSink:
    """Keep every event in a list (for tests and for inspection)."""

    def __init__(self) -> None:
        self.events: list[CapacityEvent] = []

    def __call__(self, event: CapacityEvent) -> None:
        self.events.append(event)

    @property
    def decisions(self) -> list[str]:
        return [e.decision.value for e in self.events]
