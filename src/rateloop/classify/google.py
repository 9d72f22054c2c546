"""Google Gemini API and Vertex AI: ``{"error": {"code", "message", "status", "details"}}``.

``RESOURCE_EXHAUSTED`` (429) whose limit is zero — a violation's
``quotaValue: "0"``, an ``ErrorInfo`` ``quota_limit_value: "0"`` or "limit: 0"
in the message — is ``permission``: the project has no quota for the model
("no free tier"), and no wait helps.  Otherwise it is read from its
``google.rpc.QuotaFailure`` violations: a ``quotaId`` / ``quotaMetric`` naming a day window
(``GenerateRequestsPerDayPerProjectPerModel``) makes it a spent period —
Gemini day quotas reset at midnight Pacific time, so ``reset_at`` is the next
one — while per-minute violations are a temporary throttle whose minimum wait
is ``google.rpc.RetryInfo.retryDelay`` ("35s").  Without violations the
shared throttle rule decides from the message.  ``UNAVAILABLE`` "The model is
overloaded" is overload.  Vertex streams wrap the error in a JSON list.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from rateloop.classify._evidence import Evidence, Finding, error_object
from rateloop.classify._phrases import period_of, without_google_sentence
from rateloop.classify._rules import message_of, overloaded, throttle
from rateloop.classify._standing import zero_quota
from rateloop.classify._time import parse_duration
from rateloop.signal import Dimension, Kind

__all__ = ["next_pacific_midnight", "rule"]

_KINDS: dict[str, Kind] = {
    "PERMISSION_DENIED": Kind.PERMISSION,
    "UNAUTHENTICATED": Kind.PERMISSION,
    "INVALID_ARGUMENT": Kind.INVALID,
    "FAILED_PRECONDITION": Kind.INVALID,
    "NOT_FOUND": Kind.INVALID,
    "OUT_OF_RANGE": Kind.INVALID,
    "ALREADY_EXISTS": Kind.INVALID,
    "UNIMPLEMENTED": Kind.INVALID,
    "INTERNAL": Kind.SERVER_ERROR,
    "UNKNOWN": Kind.SERVER_ERROR,
    "DEADLINE_EXCEEDED": Kind.SERVER_ERROR,
    "ABORTED": Kind.SERVER_ERROR,
}


def next_pacific_midnight(now: datetime) -> datetime | None:
    """The next midnight in America/Los_Angeles, when Gemini day quotas reset."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # start-up time: only when asked

    try:
        zone = ZoneInfo("America/Los_Angeles")
    except (ZoneInfoNotFoundError, ValueError):
        return None
    local = now.astimezone(zone)
    day = local.date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)


def _details(err: Mapping[str, Any], suffix: str) -> list[Mapping[str, Any]]:
    """The details of one type, among the first 64 (an error carries a handful)."""
    details = err.get("details")
    if not isinstance(details, list):
        return []
    return [
        d for d in details[:64]
        if isinstance(d, Mapping) and str(d.get("@type", "")).endswith(suffix)
    ]


def _violations(value: Any) -> list[Any]:
    """``violations`` as a list: a single violation object is one; anything else none."""
    if isinstance(value, list):
        return value[:64]
    if isinstance(value, Mapping):
        return [value]
    return []


def _violation_text(violation: Any) -> str:
    if not isinstance(violation, Mapping):
        return ""
    keys = ("quotaId", "quotaMetric", "description", "subject")
    return " ".join(str(violation.get(k, "")) for k in keys)


def _dimension(text: str, *, per_day: bool) -> Dimension | None:
    lowered = text.lower()
    if "input_token" in lowered or "inputtoken" in lowered:
        return Dimension.TOKENS_PER_DAY if per_day else Dimension.INPUT_TOKENS
    if "token" in lowered:
        return Dimension.TOKENS_PER_DAY if per_day else Dimension.TOKENS
    if "request" in lowered:
        return Dimension.REQUESTS_PER_DAY if per_day else Dimension.REQUESTS
    return None


def _is_zero(value: Any) -> bool:
    """A quota value of zero: ``"0"`` or ``0`` (``"0.5"`` and ``false`` are not)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value == 0
    return isinstance(value, str) and value.strip() in ("0", "0.0")


def _zero_limit(
    err: Mapping[str, Any], violations: list[Mapping[str, Any]], message: str
) -> str | None:
    """Evidence that the project's limit for this quota is zero: no allowance at all."""
    if any(_is_zero(v.get("quotaValue")) for v in violations):
        return "quotaValue 0"
    for info in _details(err, "google.rpc.ErrorInfo"):
        metadata = info.get("metadata")
        if isinstance(metadata, Mapping) and _is_zero(metadata.get("quota_limit_value")):
            return "quota_limit_value 0"
    return zero_quota(message)


def _exhausted(ev: Evidence, err: Mapping[str, Any], message: str) -> Finding:
    raw = [
        v
        for failure in _details(err, "google.rpc.QuotaFailure")
        for v in _violations(failure.get("violations"))
        if isinstance(v, Mapping)
    ]
    zero = _zero_limit(err, raw, message)
    if zero is not None:
        # "limit: 0" / quotaValue 0: the model has no quota in this project (no free
        # tier).  Its "Please retry in 10s" is never honoured: an operator must act.
        return Finding(kind=Kind.PERMISSION, code="RESOURCE_EXHAUSTED", matched=zero)
    delay = None
    for info in _details(err, "google.rpc.RetryInfo"):
        value = info.get("retryDelay")
        if isinstance(value, str):
            delay = parse_duration(value)
    violations = [
        _violation_text(v)
        for failure in _details(err, "google.rpc.QuotaFailure")
        for v in _violations(failure.get("violations"))
    ]
    for text in violations:
        period = period_of(text)
        if period is not None:
            per_day = "day" in period[0]
            return Finding(
                kind=Kind.PERIOD_QUOTA,
                code="RESOURCE_EXHAUSTED",
                matched=text.split()[0] if text.split() else period[0],
                dimension=period[1] or _dimension(text, per_day=True),
                retry_after=delay,
                reset_at=next_pacific_midnight(ev.now) if per_day else None,
            )
    if violations:
        first = violations[0]
        return Finding(
            kind=Kind.TEMPORARY,
            code="RESOURCE_EXHAUSTED",
            matched=first.split()[0] if first.split() else "RESOURCE_EXHAUSTED",
            dimension=_dimension(first, per_day=False),
            retry_after=delay,
        )
    found = throttle(
        ev, message=without_google_sentence(message), code="RESOURCE_EXHAUSTED",
        matched="RESOURCE_EXHAUSTED",
    )
    if delay is not None and found.kind is Kind.TEMPORARY:
        return Finding(
            kind=found.kind,
            code=found.code,
            matched=found.matched,
            dimension=found.dimension,
            retry_after=delay,
        )
    return found


def rule(ev: Evidence) -> Finding | None:
    err = error_object(ev.data)
    if err is None:
        return None
    status = err.get("status")
    if not isinstance(status, str):
        return None
    message = message_of(ev)
    if status == "RESOURCE_EXHAUSTED":
        return _exhausted(ev, err, message)
    if status == "UNAVAILABLE":
        if overloaded(message):
            return Finding(kind=Kind.OVERLOAD, code=status, matched="overloaded")
        return Finding(kind=Kind.SERVER_ERROR, code=status, matched=status)
    kind = _KINDS.get(status)
    if kind is None:
        return None
    return Finding(kind=kind, code=status, matched=status)
