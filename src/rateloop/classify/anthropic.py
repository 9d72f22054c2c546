"""Anthropic: ``{"type": "error", "error": {"type", "message"}, "request_id"}``.

The error type decides: ``rate_limit_error`` is a throttle (dimension from
"requests per minute" / "input tokens per minute"), ``overloaded_error`` is
overload (status 529, or inside a status-200 SSE stream as ``event: error``),
``authentication_error`` / ``permission_error`` are permission,
``invalid_request_error`` / ``request_too_large`` / ``not_found_error`` are
invalid — except "Your credit balance is too low" and "reached your specified
API usage limits", which are spend.  ``api_error`` is a server error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rateloop.classify._evidence import Evidence, Finding, error_object
from rateloop.classify._phrases import spend_of
from rateloop.classify._rules import message_of, throttle
from rateloop.classify._time import parse_datetime
from rateloop.signal import Kind

__all__ = ["rule"]

_KINDS: dict[str, Kind] = {
    "overloaded_error": Kind.OVERLOAD,
    "authentication_error": Kind.PERMISSION,
    "permission_error": Kind.PERMISSION,
    "invalid_request_error": Kind.INVALID,
    "request_too_large": Kind.INVALID,
    "not_found_error": Kind.INVALID,
    "api_error": Kind.SERVER_ERROR,
    "timeout_error": Kind.SERVER_ERROR,
    "billing_error": Kind.SPEND,
}
_USAGE_LIMIT = re.compile(r"specified API usage limits?", re.IGNORECASE)
_REGAIN = re.compile(
    r"regain access on (\d{4}-\d{2}-\d{2})(?: at (\d{2}:\d{2}))?(?: ?UTC)?", re.IGNORECASE
)


def rule(ev: Evidence) -> Finding | None:
    shaped = isinstance(ev.data, Mapping) and ev.data.get("type") == "error"
    err = error_object(ev.data)
    if err is None or not (shaped or ev.provider == "anthropic"):
        return None
    kind_name = err.get("type")
    if not isinstance(kind_name, str):
        return None
    request_id = None
    if isinstance(ev.data, Mapping) and isinstance(ev.data.get("request_id"), str):
        request_id = ev.data["request_id"]
    message = message_of(ev)
    if kind_name == "rate_limit_error":
        found = throttle(ev, message=message, code=kind_name, matched=kind_name)
        return Finding(
            kind=found.kind,
            code=found.code,
            matched=found.matched,
            dimension=found.dimension,
            retry_after=found.retry_after,
            request_id=request_id,
        )
    kind = _KINDS.get(kind_name)
    if kind is None:
        return None
    if _USAGE_LIMIT.search(message):
        regain = _REGAIN.search(message)
        reset_at = None
        if regain:
            reset_at = parse_datetime(f"{regain.group(1)}T{regain.group(2) or '00:00'}:00+00:00")
        return Finding(
            kind=Kind.SPEND,
            code=kind_name,
            matched="api usage limits",
            reset_at=reset_at,
            request_id=request_id,
        )
    spend = spend_of(message)
    if spend is not None and kind in (Kind.INVALID, Kind.PERMISSION, Kind.SPEND):
        return Finding(kind=Kind.SPEND, code=kind_name, matched=spend, request_id=request_id)
    return Finding(kind=kind, code=kind_name, matched=kind_name, request_id=request_id)
