"""One engine attempt inside a Temporal activity: the path every door of the integration shares.

:class:`_EngineCall` builds the attempt's loop (the budget less what earlier engine attempts
spent, the activity's deadline, a :class:`HeartbeatClock`), and :meth:`_EngineCall.finish`
turns its outcome into Temporal's retry language (see :mod:`rateloop.integrations.temporal`).

**Handing back to a booked start.**  When the call ends ``waiting_for_capacity`` because the
shared limiter's queue runs longer than the activity may sleep, a plain hand-back would come
back after the wait and queue again behind every call admitted meanwhile (with 100 activities
in flight on a 10 req/s scope, a call was handed back up to 9 times).  Instead the attempt
books the next free start on the limiter (``try_reserve(..., book_within=...)``: first come,
first served), hands back with ``next_retry_delay`` ending :data:`BOOKING_LEAD_SECS` before
it, and heartbeats the start (:data:`BOOKING_DETAIL`); the returning attempt, on any worker,
takes that start as its first admission (the loop's ``booked`` option,
:class:`CarriedBooking`) instead of queueing again.  Not booked: a scope with a concurrency
limit (a booking would hold its lease across the hand-back), a paused scope or a spent
quota (the limiter books neither).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar, Unpack

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, CancelledError

from rateloop._clock import Clock
from rateloop.admission import Limiter, Reservation
from rateloop.integrations._engine import (
    MIN_ENGINE_DELAY_SECS,
    EngineVerdict,
    Finish,
    GiveUp,
    RetryLater,
    engine_run_budget,
    verdict,
)
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.loop.args import CallOptions, call_spec
from rateloop.outcome.record import Outcome, Status
from rateloop.route import Cost, Route
from rateloop.timing.budget import RunBudget

__all__ = [
    "ERROR_TYPES",
    "ActivityReport",
    "CarriedBooking",
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
#: The key of the heartbeat detail that carries a start booked for the next attempt.
BOOKING_DETAIL = "rateloop_booking"
#: A hand-back to a booked start returns this long before it: the server's dispatch may lag,
#: and an early return sleeps the rest within the pause limit, holding its start.
BOOKING_LEAD_SECS = 1.0



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
    #: Seconds from the hand-back to the start booked for the next attempt (None: none booked).
    booked_in: float | None = None
    #: This attempt's first admission was the start an earlier attempt booked.
    took_booking: bool = False


@dataclass(frozen=True, slots=True)
class CarriedBooking:
    """A start an earlier engine attempt booked on the shared limiter, for this attempt to take.

    The booking's capacity was charged on the limiter at its start and settled at its
    estimate when that attempt handed back (it holds no lease: a scope with a concurrency
    limit is never booked ahead), so there is nothing left here to settle or give back.
    ``starts_in`` is counted from when this attempt read it.
    """

    route: Route
    starts_in: float
    limiter: Limiter
    start: float  # in the limiter backend's time, for the refusal check

    @property
    def stale(self) -> bool:
        """A refusal since voided it (:meth:`Limiter.voided`): the loop admits afresh."""
        return self.limiter.voided(self.route, self.start)

    def settle(self, input_tokens: int, output_tokens: int) -> None:
        """Nothing to do: settled at its estimate by the attempt that booked it."""

    async def asettle(self, input_tokens: int, output_tokens: int) -> None:
        """Nothing to do (see :meth:`settle`)."""

    def settle_usage(self, usage: Any) -> None:
        """Nothing to do (see :meth:`settle`)."""

    async def asettle_usage(self, usage: Any) -> None:
        """Nothing to do (see :meth:`settle`)."""

    def release(self) -> None:
        """Nothing to give back: a refused request counts at the provider too."""

    async def arelease(self) -> None:
        """Nothing to give back (see :meth:`release`)."""


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


def _carried_booking(
    details: Sequence[Any], routes: Sequence[Route], now: datetime, pause_limit: float,
    limiter: Limiter,
) -> CarriedBooking | None:
    """The start the previous engine attempt booked for one of ``routes``, if still usable.

    Unusable (None, so the loop admits afresh): none carried, on another route, or a start
    further than the pause limit either way (a clock far off, or a return so late that
    later starts of the schedule are due already).
    """
    last = details[-1] if details else None
    carried = last.get(BOOKING_DETAIL) if isinstance(last, dict) else None
    if not isinstance(carried, dict):
        return None
    try:
        start = datetime.fromisoformat(str(carried["start"]))
        backend_start = float(carried["backend_start"])
    except (KeyError, TypeError, ValueError):
        return None
    route = next((r for r in routes if r.scope == carried.get("scope")), None)
    if route is None or start.tzinfo is None:
        return None
    starts_in = (start - now).total_seconds()
    if abs(starts_in) > pause_limit:
        return None
    return CarriedBooking(route, max(starts_in, 0.0), limiter, backend_start)


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
        route: Route,
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
        now = loop.clock.now()
        own = options.get("deadline")
        # The call's own deadline, beyond this attempt: what a booking for the next may reach.
        self.own_deadline = (
            own if own is None or isinstance(own, datetime) else now + timedelta(seconds=own)
        )
        self.options["deadline"] = _earlier(own, _activity_deadline(info), now)
        self.on_report = on_report
        self.pause_limit = loop.policy.pause_limit_secs
        self.booked_start: datetime | None = None  # the start booked for the next attempt
        self.booked_scope: str | None = None
        self.booked_backend_start = 0.0
        self.took: CarriedBooking | None = None
        if "booked" not in options and isinstance(loop.limiter, Limiter):
            self.took = _carried_booking(
                info.heartbeat_details, (route, *(options.get("fallbacks") or ())), now,
                self.pause_limit, loop.limiter)
            if self.took is not None:
                self.options["booked"] = self.took

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {ATTEMPTS_DETAIL: self.budget.used}
        if self.booked_start is not None and self.booked_scope is not None:
            out[BOOKING_DETAIL] = {"scope": self.booked_scope,
                                   "start": self.booked_start.isoformat(),
                                   "backend_start": self.booked_backend_start}
        return out

    def book_ahead(self, outcome: Outcome) -> tuple[Limiter, Route, Cost, str, float] | None:
        """What to book for the next attempt: (limiter, route, cost, priority, within), or None.

        Only a call that ended ``waiting_for_capacity`` on a shared :class:`Limiter` is
        booked, within the time it may still wait: the activity's schedule-to-close deadline
        (or the call's own) and the policy's recovery budget.
        """
        limiter, route = self.loop.limiter, outcome.route
        if outcome.status is not Status.WAITING_FOR_CAPACITY or route is None or not isinstance(
            limiter, Limiter
        ):
            return None
        now = self.clock.now()
        within = self.loop.policy.recovery_budget_secs
        info = self.info
        ends = [self.own_deadline]
        if info.schedule_to_close_timeout and info.scheduled_time:
            ends.append(info.scheduled_time + info.schedule_to_close_timeout)
        for end in ends:
            if isinstance(end, datetime):
                within = min(within, (end - now).total_seconds() - DEADLINE_MARGIN_SECS)
        if within <= self.pause_limit:
            return None
        spec = call_spec(self.loop.policy, self.clock, route, self.options)
        return limiter, route, spec.cost, spec.priority.value, within

    def booked(self, granted: Reservation | Any) -> Reservation | None:
        """Keep ``granted`` as the next attempt's start, or None to give it back.

        A booking that holds a concurrency lease is given back: the lease would be held
        across the hand-back.  The caller settles a kept one at its estimate (its capacity
        stays charged at its start) and releases the other.
        """
        if not isinstance(granted, Reservation):
            return None
        if granted.lease_scopes:
            return None
        self.booked_start = self.clock.now() + timedelta(seconds=granted.starts_in)
        self.booked_scope = granted.route.scope
        self.booked_backend_start = granted.granted_at + granted.starts_in
        return granted

    def finish(self, outcome: Outcome, *, marked: bool) -> Any:
        """Return the value, or raise the outcome as Temporal's retry language."""
        now = self.clock.now()
        ruling = verdict(outcome, now=now)
        booked_in = None
        if self.booked_start is not None and isinstance(ruling, RetryLater):
            booked_in = (self.booked_start - now).total_seconds()
            ruling = replace(ruling, delay_secs=max(MIN_ENGINE_DELAY_SECS,
                                                    booked_in - BOOKING_LEAD_SECS))
        # The next attempt reads the attempts spent here, and its booked start (a failure
        # carries the last details).
        activity.heartbeat(self.details())
        if self.on_report is not None:
            self.on_report(
                ActivityReport(outcome, ruling, self.info.attempt, self.prior,
                               self.clock.asleep_secs, booked_in, self.took is not None)
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
    call = _EngineCall(loop, route, options, on_report)
    assert isinstance(call.loop, RateLoop)
    outcome = call.loop.call(fn, route=route, **call.options)
    if (ask := call.book_ahead(outcome)) is not None:
        limiter, on, cost, priority, within = ask
        granted = limiter.try_reserve(on, cost, priority=priority, book_within=within)
        if (kept := call.booked(granted)) is not None:
            kept.settle(cost.input_tokens, cost.output_tokens)
        elif isinstance(granted, Reservation):
            granted.release()
    return call.finish(outcome, marked=marked)


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
    call = _EngineCall(loop, route, options, on_report)
    assert isinstance(call.loop, AsyncRateLoop)
    outcome = await call.loop.call(fn, route=route, **call.options)
    if (ask := call.book_ahead(outcome)) is not None:
        limiter, on, cost, priority, within = ask
        granted = await limiter.atry_reserve(on, cost, priority=priority, book_within=within)
        if (kept := call.booked(granted)) is not None:
            await kept.asettle(cost.input_tokens, cost.output_tokens)
        elif isinstance(granted, Reservation):
            await granted.arelease()
    return call.finish(outcome, marked=marked)
