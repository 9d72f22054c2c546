"""One engine attempt inside a Temporal activity: the path every door of the integration shares.

:class:`_EngineCall` builds the attempt's loop (the budget less what earlier engine attempts
spent, the activity's deadline, a :class:`HeartbeatClock`), and :meth:`_EngineCall.finish`
turns its outcome into Temporal's retry language (see :mod:`rateloop.integrations.temporal`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, Unpack

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, CancelledError

from rateloop._clock import Clock
from rateloop.integrations._engine import (
    EngineVerdict,
    Finish,
    GiveUp,
    RetryLater,
    engine_run_budget,
    verdict,
)
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.loop.args import CallOptions
from rateloop.outcome.record import Outcome, Status
from rateloop.route import Route
from rateloop.timing.budget import RunBudget

__all__ = [
    "ERROR_TYPES",
    "ActivityReport",
    "HeartbeatClock",
    "Marked",
    "aactivity_call",
    "activity_call",
    "error_type",
]

T = TypeVar("T")

#: The key of the heartbeat detail that carries the attempts made so far to the next attempt.
ATTEMPTS_DETAIL = "rateloop_attempts"
#: Heartbeat at least this often while asleep when the activity has no heartbeat timeout.
DEFAULT_HEARTBEAT_SECS = 10.0
#: Stop this long before the activity's own timeout: the error must reach the server in time.
DEADLINE_MARGIN_SECS = 2.0



def error_type(status: Status | str) -> str:
    """The ``ApplicationError.type`` of an outcome's status: ``"rateloop.<status>"``."""
    return f"rateloop.{Status(status).value}"


#: The error types an activity helper raises, terminal ones marked non-retryable themselves.
ERROR_TYPES = tuple(error_type(s) for s in Status if s not in (Status.COMPLETED, Status.DEGRADED))


@dataclass(frozen=True, slots=True)
class Marked:
    """A result with its mark: ``degraded`` when it was done on an approved fallback."""

    value: Any
    degraded: bool
    model: str
    reason: str


@dataclass(frozen=True, slots=True)
class ActivityReport:
    """How one engine attempt ended, given to ``on_report`` before the value or the error."""

    outcome: Outcome
    verdict: EngineVerdict
    engine_attempt: int
    prior_attempts: int
    asleep_secs: float


class HeartbeatClock:
    """A clock that heartbeats while it sleeps and counts the seconds slept.

    ``details()`` is heartbeated every ``every`` seconds of sleep (and once before each
    sleep), so the server sees the activity alive and the next attempt can read it.
    """

    def __init__(self, inner: Clock, *, every: float, details: Callable[[], Any]) -> None:
        if not every > 0:
            raise ValueError(f"HeartbeatClock every must be > 0 seconds, got {every!r}")
        self._inner, self._every, self._details = inner, every, details
        self.asleep_secs = 0.0

    def __repr__(self) -> str:
        return f"HeartbeatClock({self._inner!r}, every={self._every:g})"

    def monotonic(self) -> float:
        return self._inner.monotonic()

    def now(self) -> datetime:
        return self._inner.now()

    def _chunks(self, seconds: float) -> list[float]:
        whole, rest = divmod(max(seconds, 0.0), self._every)
        return [self._every] * int(whole) + ([rest] if rest > 0 else [])

    def sleep(self, seconds: float) -> None:
        for chunk in self._chunks(seconds):
            activity.heartbeat(self._details())
            if activity.is_cancelled():
                raise CancelledError("the activity was cancelled while rateloop waited")
            start = self._inner.monotonic()
            self._inner.sleep(chunk)
            self.asleep_secs += self._inner.monotonic() - start

    async def asleep(self, seconds: float) -> None:
        for chunk in self._chunks(seconds):
            activity.heartbeat(self._details())
            start = self._inner.monotonic()
            try:
                await self._inner.asleep(chunk)  # a cancelled activity raises here
            finally:
                self.asleep_secs += self._inner.monotonic() - start


# --- one engine attempt: the path every door shares -------------------------------------


def _carried_attempts(details: Sequence[Any]) -> int:
    """The attempt count the previous engine attempt heartbeated, or 0."""
    last = details[-1] if details else None
    count = last.get(ATTEMPTS_DETAIL) if isinstance(last, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def _activity_deadline(info: activity.Info) -> datetime | None:
    """When this engine attempt must have answered the server, less a margin."""
    ends: list[datetime] = []
    if info.start_to_close_timeout and info.started_time:
        ends.append(info.started_time + info.start_to_close_timeout)
    if info.schedule_to_close_timeout and info.scheduled_time:
        ends.append(info.scheduled_time + info.schedule_to_close_timeout)
    return min(ends) - timedelta(seconds=DEADLINE_MARGIN_SECS) if ends else None


def _earlier(a: datetime | float | None, b: datetime | None, now: datetime) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    mine = a if isinstance(a, datetime) else now + timedelta(seconds=a)
    return min(mine, b)


class _EngineCall:
    """One engine attempt of one call: the loop it runs, then its verdict as Temporal's."""

    def __init__(
        self,
        loop: RateLoop | AsyncRateLoop,
        options: CallOptions,
        on_report: Callable[[ActivityReport], Any] | None,
    ) -> None:
        info = activity.info()
        self.info = info
        self.prior = max(info.attempt - 1, _carried_attempts(info.heartbeat_details))
        self.budget: RunBudget = engine_run_budget(loop.policy, prior_attempts=self.prior)
        every = DEFAULT_HEARTBEAT_SECS
        if info.heartbeat_timeout:
            every = min(every, max(info.heartbeat_timeout.total_seconds() / 3, 0.05))
        self.clock = HeartbeatClock(loop.clock, every=every, details=self.details)
        self.loop = loop.replace(run_budget=self.budget, clock=self.clock)
        self.options = CallOptions(**options)
        self.options["deadline"] = _earlier(
            options.get("deadline"), _activity_deadline(info), loop.clock.now()
        )
        self.on_report = on_report

    def details(self) -> dict[str, int]:
        return {ATTEMPTS_DETAIL: self.budget.used}

    def finish(self, outcome: Outcome, *, marked: bool) -> Any:
        """Return the value, or raise the outcome as Temporal's retry language."""
        now = self.clock.now()
        ruling = verdict(outcome, now=now)
        # The next attempt reads the attempts spent here (a failure carries the last details).
        activity.heartbeat(self.details())
        if self.on_report is not None:
            self.on_report(
                ActivityReport(outcome, ruling, self.info.attempt, self.prior,
                               self.clock.asleep_secs)
            )
        return _apply(ruling, outcome, marked=marked)


def _details(outcome: Outcome) -> dict[str, Any]:
    """What the workflow may read from the error: no prompt, no key, only the verdict."""
    route = outcome.route
    return {
        "status": outcome.status.value,
        "scope": route.scope if route is not None else None,
        "retry_at": outcome.retry_at.isoformat() if outcome.retry_at is not None else None,
        "attempts": outcome.attempts.provider_requests,
    }


def _apply(ruling: EngineVerdict, outcome: Outcome, *, marked: bool) -> Any:
    match ruling:
        case Finish(value, degraded):
            if not marked:
                return value
            route = outcome.route
            return Marked(value, degraded, route.model if route is not None else "",
                          outcome.reason)
        case RetryLater(delay, reason, status):
            raise ApplicationError(
                reason,
                _details(outcome),
                type=error_type(status),
                next_retry_delay=timedelta(seconds=delay),
                category=ApplicationErrorCategory.BENIGN,  # an expected wait: logged at DEBUG
            )
        case GiveUp(status, reason):
            raise ApplicationError(
                reason, _details(outcome), type=error_type(status), non_retryable=True
            ) from ruling.error


def activity_call(
    loop: RateLoop,
    fn: Callable[..., T],
    *,
    route: Route,
    on_report: Callable[[ActivityReport], Any] | None = None,
    marked: bool = False,
    **options: Unpack[CallOptions],
) -> Any:
    """Run ``fn(route)`` through ``loop`` inside a sync activity, in Temporal's retry language.

    Returns the value (a :class:`Marked` with ``marked=True``), or raises an
    ``ApplicationError`` (retryable with ``next_retry_delay`` for a wait, non-retryable for a
    terminal outcome).  ``on_report`` sees every engine attempt's :class:`ActivityReport`.
    """
    if not isinstance(loop, RateLoop):
        raise TypeError(f"activity_call takes a RateLoop (aactivity_call the async one), got "
                        f"{loop!r}")
    call = _EngineCall(loop, options, on_report)
    assert isinstance(call.loop, RateLoop)
    return call.finish(call.loop.call(fn, route=route, **call.options), marked=marked)


async def aactivity_call(
    loop: AsyncRateLoop,
    fn: Callable[..., Any],
    *,
    route: Route,
    on_report: Callable[[ActivityReport], Any] | None = None,
    marked: bool = False,
    **options: Unpack[CallOptions],
) -> Any:
    """The asyncio twin of :func:`activity_call` (``fn`` may return an awaitable)."""
    if not isinstance(loop, AsyncRateLoop):
        raise TypeError(f"aactivity_call takes an AsyncRateLoop (activity_call the sync one), "
                        f"got {loop!r}")
    call = _EngineCall(loop, options, on_report)
    assert isinstance(call.loop, AsyncRateLoop)
    return call.finish(await call.loop.call(fn, route=route, **call.options), marked=marked)
