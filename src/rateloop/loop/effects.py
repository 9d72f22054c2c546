"""The effects of the RATE loop: what its generator asks a driver to do, and what comes back.

The loop's algorithm (``rateloop.loop._BaseRateLoop._drive``) never does I/O:
it yields one of these values and receives the result.  ``RateLoop``
performs them with blocking calls, ``AsyncRateLoop`` with ``await``.  The
helpers below read what an attempt's result says about SDK retries, token
usage and pauses; they are shared by both drivers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rateloop.admission.profile import reports_tokens
from rateloop.loop.sdk_count import sdk_retries_taken
from rateloop.route import Cost, Route
from rateloop.signal import Kind, LimitSignal

__all__ = [
    "Admit",
    "Call",
    "Check",
    "Effect",
    "LimiterCall",
    "Raised",
    "Returned",
    "Sleep",
    "pause_until",
    "result_error",
    "sdk_retries",
    "usage_of",
]


@dataclass(frozen=True, slots=True)
class Admit:
    route: Route
    cost: Cost
    priority: str


@dataclass(frozen=True, slots=True)
class Call:
    route: Route


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class LimiterCall:
    """Call ``method`` (sync) or ``a<method>`` (async) on ``target`` with ``args``."""

    target: Any
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Check:
    route: Route


@dataclass(frozen=True, slots=True)
class Returned:
    value: Any
    requests: int = 0  # requests counted by helper-built SDK clients during the attempt


@dataclass(frozen=True, slots=True)
class Raised:
    error: BaseException
    requests: int = 0


Effect = Admit | Call | Sleep | LimiterCall | Check


def pause_until(signal: LimitSignal, now: datetime) -> datetime | None:
    """Until when a signal with a server minimum holds its whole scope, for every worker."""
    if signal.kind in (Kind.TEMPORARY, Kind.OVERLOAD) and signal.retry_after:
        return now + timedelta(seconds=signal.retry_after)
    if signal.kind is Kind.PERIOD_QUOTA:
        # An empty day window: no worker should spend a request to find that out.
        if signal.reset_at is not None and signal.reset_at > now:
            return signal.reset_at
        if signal.retry_after:
            return now + timedelta(seconds=signal.retry_after)
    return None


def result_error(result: Returned | Raised) -> BaseException | None:
    return result.error if isinstance(result, Raised) else None


def sdk_retries(result: Returned | Raised) -> int:
    """Retries an SDK took inside one of our attempts, when it tells us."""
    if result.requests > 0:
        return result.requests - 1
    target = result.error if isinstance(result, Raised) else result.value
    return sdk_retries_taken(target)


def usage_of(result: Returned | Raised) -> Any | None:
    """The usage a successful response reports (the SDK's object or its JSON), if any.

    It is settled as the route's accounting profile reads it
    (:meth:`Reservation.settle_usage`): cache reads left out where the
    provider does not count them, cache writes counted where it does.
    """
    if not isinstance(result, Returned):
        return None
    value = result.value
    usage = getattr(value, "usage", None) or getattr(value, "usage_metadata", None)
    if usage is None and isinstance(value, dict):
        usage = value.get("usage") or value.get("usageMetadata")
    if usage is None and isinstance(getattr(value, "status_code", None), int):
        # An HTTP response (httpx, requests): the usage is in its JSON body.
        try:
            body = value.json()
        except Exception:
            body = None
        if isinstance(body, dict):
            usage = body.get("usage") or body.get("usageMetadata")
    if usage is None or not reports_tokens(usage):
        return None
    return usage

