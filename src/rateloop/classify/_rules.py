"""Rules shared by every provider: the throttle decision and the status fallback.

:func:`throttle` is the rule that matters most, written once: a refusal that
looks like a rate limit is **spend** if it names billing or credit, a spent
**period** if it names a day/week/month window, and only otherwise a
**temporary**, retryable throttle.

:func:`by_status` is what is left when no provider rule recognised the
response: 2xx ok; 402 spend; 401/403 permission; 400/404/413/422 and other
4xx invalid; 408 network; 409 temporary; 429 throttle; 529 and "overloaded"
503s overload; other 5xx server_error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rateloop.classify._evidence import Evidence, Finding, error_object
from rateloop.classify._phrases import dimension_of, never_fits, period_of, spend_of, wait_in
from rateloop.classify._standing import credit_exhausted, must_change, zero_quota
from rateloop.signal import Kind

__all__ = ["by_status", "code_of", "message_of", "overloaded", "throttle"]

_OVERLOADED = re.compile(
    r"\boverloaded\b|\bover capacity\b|\bat capacity\b|\bhigh demand\b|"
    r"\bno capacity available\b",
    re.IGNORECASE,
)
_MAX_MESSAGE = 20_000


def message_of(ev: Evidence) -> str:
    """The error message, falling back to the whole body text."""
    err = error_object(ev.data)
    if err is not None:
        for key in ("message", "error", "detail", "Message"):
            value = err.get(key)
            if isinstance(value, str) and value:
                return value[:_MAX_MESSAGE]
    return ev.text[:_MAX_MESSAGE]


def code_of(ev: Evidence) -> str | None:
    """The provider's error code (``code``, else ``type``), as a string."""
    err = error_object(ev.data)
    if err is None:
        return None
    for key in ("code", "type", "status"):
        value = err.get(key)
        if isinstance(value, str) and value and value != "error":
            return value
    return None


def overloaded(text: str) -> bool:
    return _OVERLOADED.search(text) is not None


def throttle(
    ev: Evidence, *, message: str, code: str | None, matched: str | None
) -> Finding:
    """Must change, else a zero limit, else spend, else spent period, else a throttle.

    A request larger than its whole limit, or one the provider refuses as
    it stands (Bedrock's on-demand throughput, max tokens over the model's
    limit, a content filter), is ``invalid`` whatever the status: waiting
    cannot help it.  A quota whose limit is zero is ``permission``: there is
    nothing to wait for (:mod:`rateloop.classify._standing`).  A period
    named only in prose is ``soft``: the core turns it into a short throttle
    when the stated wait is short.
    """
    too_large = never_fits(message) or must_change(message)
    if too_large is not None:
        return Finding(kind=Kind.INVALID, code=code, matched=too_large)
    zero = zero_quota(message)
    if zero is not None:
        return Finding(kind=Kind.PERMISSION, code=code, matched=zero)
    spend = spend_of(message) or credit_exhausted(message)
    if spend is not None:
        return Finding(kind=Kind.SPEND, code=code, matched=spend)
    period = period_of(message)
    if period is not None:
        phrase, dimension = period
        return Finding(
            kind=Kind.PERIOD_QUOTA,
            code=code,
            matched=phrase,
            dimension=dimension,
            retry_after=wait_in(message),
            soft_period=True,
        )
    return Finding(
        kind=Kind.TEMPORARY,
        code=code,
        matched=matched,
        dimension=dimension_of(message),
        retry_after=wait_in(message),
    )


def _sse(ev: Evidence) -> Finding:
    """A 2xx stream that carried an ``event: error``."""
    err: Mapping[str, Any] | None = error_object(ev.data)
    kind_text = str(err.get("type", "")) if err is not None else ""
    message = message_of(ev)
    if kind_text == "overloaded_error" or overloaded(message):
        return Finding(kind=Kind.OVERLOAD, code=kind_text or None, matched="overloaded_error")
    if "rate_limit" in kind_text:
        return throttle(ev, message=message, code=kind_text, matched=kind_text)
    return Finding(kind=Kind.SERVER_ERROR, code=kind_text or None, matched="event: error")


def by_status(ev: Evidence) -> Finding:
    status = ev.status
    code = code_of(ev)
    if status is None:
        return Finding(kind=Kind.NETWORK, matched="no response")
    if 200 <= status < 300:
        return _sse(ev) if ev.sse_error else Finding(kind=Kind.OK)
    message = message_of(ev)
    matched = str(status)
    if status == 429:
        return throttle(ev, message=message, code=code, matched=code)
    if 400 <= status < 500:
        spend = spend_of(message) or credit_exhausted(message)
        if status == 402 or spend is not None:
            return Finding(kind=Kind.SPEND, code=code, matched=spend or matched)
        if status in (401, 403):
            return Finding(kind=Kind.PERMISSION, code=code, matched=matched)
        if status == 408:
            return Finding(kind=Kind.NETWORK, code=code, matched=matched)
        if status == 409:
            return Finding(kind=Kind.TEMPORARY, code=code, matched=matched)
        return Finding(kind=Kind.INVALID, code=code, matched=matched)
    if status == 529 or (status == 503 and overloaded(message)):
        evidence = "529" if status == 529 else "overloaded"
        return Finding(kind=Kind.OVERLOAD, code=code, matched=evidence)
    if 500 <= status < 600:
        return Finding(kind=Kind.SERVER_ERROR, code=code, matched=matched)
    return Finding(kind=Kind.UNKNOWN, code=code, matched=matched)
