"""The normalized refusal signal: what Read produces and everything else consumes.

A :class:`LimitSignal` says what kind of refusal came back (:class:`Kind`),
whether waiting in the short loop can help (``retryable``), the server's
minimum wait (``retry_after``), when a window resets (``reset_at``) and which
limit dimension was hit.  It also carries what the provider told us about
its limits (``observed``), which admission uses to learn.

What ``retryable`` means, per kind (the default for each kind; see
:data:`RETRYABLE_KINDS`):

=============== ========= =================================================
kind            retryable why
=============== ========= =================================================
ok              no        nothing to retry
temporary       yes       a short throttle; wait at least ``retry_after``
period_quota    no        a day/month window is spent; waiting minutes will
                          not help (``reset_at`` says when it returns)
spend           no        billing, credit or a hard spend cap; a human acts
permission      no        401/403: the key or the account must change
invalid         no        400/404/413/422: the request must change
overload        yes       the provider is overloaded (529, 503 overloaded)
server_error    yes       another 5xx; the same request may succeed later
network         yes       no response arrived (reset, timeout before reply)
unknown         no        not recognised; surfaced as it is
=============== ========= =================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

__all__ = [
    "CONNECT_FAILED",
    "DEFAULT_PAUSE_LIMIT_SECS",
    "MAX_WAIT_SECONDS",
    "RETRYABLE_KINDS",
    "Dimension",
    "Kind",
    "LimitSignal",
    "Observed",
    "clamp_wait",
]

#: The ``code`` of a ``network`` signal whose connection never opened (refused, an
#: unknown host, no route to it): no byte of the request was sent.  To an endpoint
#: that has not answered in this process it is most likely a wrong URL or a server
#: that is not running, and the loop does not retry it (:mod:`rateloop.timing.decide`).
CONNECT_FAILED = "connect_failed"

#: Every wait a classifier reports is clamped to [0, MAX_WAIT_SECONDS].
MAX_WAIT_SECONDS = 86_400.0

#: The longest one pause may last by default (``Policy.pause_limit_secs``): a
#: wait the loop may sleep through.  Read uses it too, as the far-wait
#: threshold: a throttle asking for longer is a spent period, not a short one.
DEFAULT_PAUSE_LIMIT_SECS = 3600.0


class Kind(StrEnum):
    """What kind of refusal a response, exception or CLI output was."""

    OK = "ok"
    TEMPORARY = "temporary"
    PERIOD_QUOTA = "period_quota"
    SPEND = "spend"
    PERMISSION = "permission"
    INVALID = "invalid"
    OVERLOAD = "overload"
    SERVER_ERROR = "server_error"
    NETWORK = "network"
    UNKNOWN = "unknown"


#: The kinds a short retry loop may retry by default.
RETRYABLE_KINDS: frozenset[Kind] = frozenset(
    {Kind.TEMPORARY, Kind.OVERLOAD, Kind.SERVER_ERROR, Kind.NETWORK}
)


class Dimension(StrEnum):
    """Which limit was hit (or is described by an observation)."""

    REQUESTS = "requests"
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    TOKENS = "tokens"
    REQUESTS_PER_DAY = "requests_per_day"
    TOKENS_PER_DAY = "tokens_per_day"
    CONCURRENCY = "concurrency"
    SPEND = "spend"


def clamp_wait(seconds: float | None) -> float | None:
    """Clamp a wait to [0, MAX_WAIT_SECONDS]; NaN and garbage become None."""
    if seconds is None:
        return None
    try:
        value = float(seconds)
    except (TypeError, ValueError, OverflowError):
        return None
    if math.isnan(value):
        return None
    return min(max(value, 0.0), MAX_WAIT_SECONDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    """What a provider said about one limit dimension (from response headers).

    ``reset_after`` is seconds until the window refills, clamped like every wait.
    ``window`` is the length in seconds of the window ``limit`` counts over
    (60 for a per-minute limit, 86400 per day, 3600 per hour), or ``None``
    when the headers do not say and the provider's documentation does not
    either: a limit is only meaningful with its window.
    """

    dimension: Dimension
    limit: float | None = None
    remaining: float | None = None
    reset_after: float | None = None
    window: float | None = None

    def __repr__(self) -> str:
        parts = [self.dimension.value]
        for name in ("limit", "remaining", "reset_after", "window"):
            value = getattr(self, name)
            if value is not None:
                unit = "s" if name in ("reset_after", "window") else ""
                parts.append(f"{name}={value:g}{unit}")
        return f"Observed({', '.join(parts)})"


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitSignal:
    """One normalized refusal (or success) signal.  Frozen and hashable."""

    kind: Kind
    retryable: bool
    retry_after: float | None = None
    reset_at: datetime | None = None
    dimension: Dimension | None = None
    provider: str | None = None
    request_id: str | None = None
    status: int | None = None
    code: str | None = None
    matched: str | None = None
    scope: str | None = None
    operation: str | None = None
    observed: tuple[Observed, ...] = field(default=())
    #: Names of headers or fields whose values could not be read (a malformed
    #: ``retry-after``): evidence that was sent and ignored.
    malformed: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.reset_at is not None and self.reset_at.tzinfo is None:
            raise ValueError(f"reset_at must be timezone-aware, got {self.reset_at!r}")
        clamped = clamp_wait(self.retry_after)
        if clamped != self.retry_after:
            object.__setattr__(self, "retry_after", clamped)

    @classmethod
    def of(cls, kind: Kind, **fields: object) -> LimitSignal:
        """A signal of ``kind`` whose ``retryable`` is the kind's default."""
        return cls(kind=kind, retryable=kind in RETRYABLE_KINDS, **fields)  # type: ignore[arg-type]

    @property
    def ok(self) -> bool:
        return self.kind is Kind.OK

    def __repr__(self) -> str:
        parts = [self.kind.value, "retryable" if self.retryable else "final"]
        if self.status is not None:
            parts.append(f"status={self.status}")
        if self.retry_after is not None:
            parts.append(f"retry_after={self.retry_after:g}s")
        if self.reset_at is not None:
            parts.append(f"reset_at={self.reset_at.isoformat()}")
        for name in ("dimension", "provider", "code", "request_id", "scope", "operation"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={str(value)!r}")
        if self.matched is not None:
            parts.append(f"matched={self.matched!r}")
        if self.observed:
            parts.append(f"observed={len(self.observed)}")
        if self.malformed:
            parts.append(f"malformed={list(self.malformed)!r}")
        return f"LimitSignal({', '.join(parts)})"
