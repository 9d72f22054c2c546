"""How every call ends: :class:`Status`, :class:`Outcome`, and the attempt ledger.

Every call through rateloop ends in exactly one :class:`Status`.  No exit is
silent and none reports success after a skipped or failed step.

The attempt ledger counts attempts by layer, so the number of requests the
provider actually saw is always known: rateloop's own loop, retries taken
inside an SDK, and redeliveries by a task queue.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from rateloop.route import Route
from rateloop.signal import LimitSignal

if TYPE_CHECKING:
    from rateloop.outcome.events import CapacityEvent

__all__ = ["AttemptLedger", "Attempts", "Outcome", "Status"]


class Status(StrEnum):
    """The explicit terminal state of a call."""

    COMPLETED = "completed"
    DEGRADED = "degraded"
    WAITING_FOR_RESET = "waiting_for_reset"
    WAITING_FOR_CAPACITY = "waiting_for_capacity"
    NEEDS_OPERATOR = "needs_operator"
    INVALID = "invalid"
    FAILED_RETRY_EXHAUSTED = "failed_retry_exhausted"
    REJECTED = "rejected"

    @property
    def succeeded(self) -> bool:
        """True for ``completed`` and ``degraded``: the work was done."""
        return self is Status.COMPLETED or self is Status.DEGRADED  # (``in`` compares strings)


@dataclass(frozen=True, slots=True)
class Attempts:
    """Attempts counted by layer (a frozen snapshot of an :class:`AttemptLedger`)."""

    loop: int = 0
    sdk: int = 0
    redeliveries: int = 0

    @property
    def provider_requests(self) -> int:
        """Requests that reached the provider: each loop attempt plus SDK retries."""
        return self.loop + self.sdk

    @property
    def total(self) -> int:
        return self.loop + self.sdk + self.redeliveries

    def __repr__(self) -> str:
        return f"Attempts(loop={self.loop}, sdk={self.sdk}, redeliveries={self.redeliveries})"


#: The attempts of a call done on its first try: most calls' (a frozen value, shared).
_ONE_ATTEMPT = Attempts(loop=1)


class AttemptLedger:
    """A thread-safe running count of attempts by layer."""

    __slots__ = ("_lock", "loop", "redeliveries", "sdk")

    def __init__(self, *, loop: int = 0, sdk: int = 0, redeliveries: int = 0) -> None:
        self._lock = threading.Lock()
        self.loop = loop
        self.sdk = sdk
        self.redeliveries = redeliveries

    def record_loop(self, n: int = 1) -> None:
        """rateloop's own loop made ``n`` more attempts."""
        with self._lock:
            self.loop += n

    def record_sdk(self, retries: int) -> None:
        """An SDK retried ``retries`` times inside one of our attempts."""
        if retries < 0:
            raise ValueError(f"SDK retries must be >= 0, got {retries!r}")
        with self._lock:
            self.sdk += retries

    def record_redelivery(self, n: int = 1) -> None:
        """A queue delivered the task again."""
        with self._lock:
            self.redeliveries += n

    def snapshot(self) -> Attempts:
        """The counts now, frozen (a first-try call's, ``loop=1``, is one shared value)."""
        with self._lock:
            loop, sdk, redeliveries = self.loop, self.sdk, self.redeliveries
        if loop == 1 and not sdk and not redeliveries:
            return _ONE_ATTEMPT
        return Attempts(loop=loop, sdk=sdk, redeliveries=redeliveries)

    def __repr__(self) -> str:
        return f"AttemptLedger(loop={self.loop}, sdk={self.sdk}, redeliveries={self.redeliveries})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """The end of one call: exactly one status, and the truth about how it got there.

    ``limited_route`` is set when the call finished on a fallback: the route
    that was limited.  ``reason`` is a short sentence a human can read.
    ``error`` is the last exception the call raised, the original object
    (None when every attempt returned); ``waited_secs`` is the total time
    the call slept: backoff, server minimums and admission waits together.

    ``rung`` is the rung of the degrade ladder the call finished on
    (``standard``, ``flex``, ``batch`` or ``fallback``; docs/ladder.md), and
    ``cost_usd`` what it cost there: the route's prices with the tier's
    discount, for the usage the provider reported (else the reserved cost),
    None when the route has no prices or nothing was served (refusals are not
    billed).  ``next_rung`` is set when the ladder hands the call on:
    ``"batch"`` (status ``waiting_for_capacity``, ``route`` at the batch tier:
    submit it to the batch API) or ``"park"`` (checkpoint it until ``retry_at``).
    """

    status: Status
    reason: str
    value: Any = None
    attempts: Attempts = field(default_factory=Attempts)
    route: Route | None = None
    limited_route: Route | None = None
    retry_at: datetime | None = None
    signal: LimitSignal | None = None
    events: Sequence[CapacityEvent] = ()
    error: BaseException | None = None
    waited_secs: float = 0.0
    rung: str | None = None
    cost_usd: float | None = None
    next_rung: str | None = None

    @property
    def ok(self) -> bool:
        """True when the work was done (``completed`` or ``degraded``)."""
        return self.status.succeeded

    def __repr__(self) -> str:
        parts = [self.status.value, f"reason={self.reason!r}", repr(self.attempts)]
        if self.route is not None:
            parts.append(f"route={self.route.scope!r}")
        if self.retry_at is not None:
            parts.append(f"retry_at={self.retry_at.isoformat()}")
        if self.signal is not None:
            parts.append(f"signal={self.signal.kind.value}")
        if self.waited_secs:
            parts.append(f"waited={self.waited_secs:g}s")
        if self.rung is not None and self.rung != "standard":
            parts.append(f"rung={self.rung}")
        if self.cost_usd is not None:
            parts.append(f"cost=${self.cost_usd:.6f}")
        if self.next_rung is not None:
            parts.append(f"next_rung={self.next_rung}")
        if self.error is not None:
            parts.append(f"error={type(self.error).__name__}")
        return f"Outcome({', '.join(parts)})"
