"""The RATE loop's algorithm, once: :class:`_BaseRateLoop` and its effect generator.

How it works: :meth:`_BaseRateLoop._drive` holds the whole algorithm of a
call -- admit, attempt, classify, decide, wait, fall back, settle, record --
as a generator that yields effects (:mod:`rateloop.loop.effects`) and receives
their results.  :class:`rateloop.loop.RateLoop` performs them with blocking
calls, :class:`rateloop.loop.AsyncRateLoop` with ``await``.  The decisions
come from the sans-IO :func:`rateloop.timing.decide.decide`; the arguments are
checked by :mod:`rateloop.loop.args`.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from rateloop._clock import Clock, system_clock
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied
from rateloop.classify import classify_exception, classify_response
from rateloop.errors import LimitsWarning, RateLimitExhausted, SdkRetriesWarning
from rateloop.loop.args import (
    CallOptions,
    CallSpec,
    call_spec,
    check_classify,
    check_clock,
    check_limiter,
    check_policy,
    check_rng,
    check_run,
    check_sinks,
    takes_call_labels,
)
from rateloop.loop.effects import (
    Admit,
    Call,
    Check,
    Effect,
    LimiterCall,
    Raised,
    Returned,
    Sleep,
    pause_until,
    result_error,
    sdk_retries,
    usage_of,
)
from rateloop.outcome.console import ConsoleSink
from rateloop.outcome.events import CapacityEvent, DecisionKind, EventSink, signal_fields
from rateloop.outcome.record import AttemptLedger, Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.signal import Kind, LimitSignal
from rateloop.timing.budget import CallBudget, RunBudget
from rateloop.timing.decide import FallBack, LoopState, Proceed, Stop, Wait, decide, fall_back_now
from rateloop.timing.fallback import build_chain
from rateloop.timing.writes import WriteOutcome, is_ambiguous_failure, normalize_write_outcome

__all__ = ["Classifier"]

_Flow = Generator[Effect, Any, Outcome]

P = ParamSpec("P")
T = TypeVar("T")

Classifier = Callable[[BaseException], LimitSignal]

# Outcomes about the request itself, not capacity: the caller gets the provider's own exception.
_NOT_CAPACITY = frozenset({Kind.INVALID, Kind.PERMISSION})


def _default_sinks(clock: Clock) -> tuple[EventSink, ...]:
    """A person at a terminal sees progress; a library's non-interactive use prints nothing."""
    try:
        tty = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        tty = False
    return (ConsoleSink(clock=clock),) if tty else ()


# --- the base -------------------------------------------------------------


#: How far ahead the loop books a start (the limiter's ``book_within``).  A booked call
#: sleeps until its start; a refusal meanwhile that voids it (``Reservation.stale``) has
#: it admitted again then.  The horizon keeps bookings to a few seconds of pacing; a
#: longer admission wait is served by polling ``try_reserve``.
BOOK_HORIZON_SECS = 5.0
#: A booked start, or a wait for capacity, is reached this much late.  The limiter's
#: model of a provider's bucket frees a unit on the exact instant the provider's does;
#: arriving on that instant leaves the provider a rounding error from refusing (its
#: refill runs on another clock), and a refused request still spends its slot there, so
#: every later start of the schedule would be refused too.  A millisecond later the
#: provider has surely refilled; the schedule itself does not move.
ARRIVAL_SLACK_SECS = 0.001


class _BaseRateLoop:
    """Configuration and the algorithm shared by both drivers."""

    _is_async = False  # which half of the limiter contract the driver calls

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        limiter: Any = None,
        clock: Clock | None = None,
        sinks: Sequence[EventSink] | None = None,
        classify: Classifier | None = None,
        run_budget: RunBudget | None = None,
        run_id: str | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self.policy = check_policy(policy)
        self.limiter = check_limiter(limiter, is_async=self._is_async)
        if clock is not None:
            check_clock(clock, is_async=self._is_async)
        self.clock = clock if clock is not None else system_clock
        self.sinks = _default_sinks(self.clock) if sinks is None else check_sinks(sinks)
        check_classify(classify)
        self.classify = classify
        check_run(run_budget, run_id)
        self.run_budget = run_budget
        self.run_id = run_id
        check_rng(rng)
        self._rng = rng
        # Sinks that also want to know when calls start and end (ConsoleSink's summary).
        self._observers = tuple(s for s in self.sinks if hasattr(s, "call_finished"))
        # Which observers' call_started takes operation= and priority= (an older one takes
        # the scope alone and keeps working).
        self._rich_start = frozenset(
            id(s) for s in self._observers if takes_call_labels(getattr(s, "call_started", None))
        )
        self._warned_sdk_retries = False
        self._limits_used: set[str] | None = set()  # None once checked out (warned or all used)

    def __repr__(self) -> str:
        limiter = type(self.limiter).__name__ if self.limiter is not None else None
        return f"{type(self).__name__}(policy=..., limiter={limiter}, clock={self.clock!r})"

    def _spec(self, route: Route, options: CallOptions) -> CallSpec:
        return call_spec(self.policy, self.clock, route, options)

    def _emit(self, event: CapacityEvent) -> None:
        for sink in self.sinks:
            sink(event)

    def _signal_of(self, result: Returned | Raised) -> LimitSignal:
        now = self.clock.now()
        if isinstance(result, Raised):
            if self.classify is not None:
                return self.classify(result.error)
            return classify_exception(result.error, now=now)
        value = result.value
        status = getattr(value, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return classify_response(value, now=now)
        return LimitSignal.of(Kind.OK)

    def _drive(self, spec: CallSpec) -> _Flow:
        """The RATE loop for one call, as a generator of effects."""
        clock, policy = self.clock, self.policy
        start = clock.monotonic()
        wall0 = clock.now()
        deadline_mono = (
            start + (spec.deadline - wall0).total_seconds() if spec.deadline is not None else None
        )
        # enabled = false: the loop steps aside; one attempt, no admission, no wait.
        on = policy.enabled
        limiter = self.limiter if on else None
        budget = CallBudget(
            max_attempts=policy.max_attempts if on else 1,
            recovery_budget_secs=policy.recovery_budget_secs,
            max_error_attempts=policy.max_error_attempts if on else 1,
            started_at=start,
            deadline=deadline_mono,
            max_wait_secs=policy.max_wait_secs,
            run=self.run_budget,
        )
        state = LoopState(
            chain=build_chain(spec.route, spec.fallbacks),
            budget=budget,
            backoff=policy.backoff(rng=self._rng),
            epoch=(start, wall0),
            cost=spec.cost,
            data_class=spec.data_class,
        )
        ledger = AttemptLedger()
        events: list[CapacityEvent] = []
        signal: LimitSignal | None = None
        last_error: BaseException | None = None
        waited = 0.0
        controlled_retry_used = False
        for observer in self._observers:
            started = getattr(observer, "call_started", None)
            if started is None:
                continue
            if id(observer) in self._rich_start:
                started(spec.route.scope, operation=spec.operation, priority=spec.priority)
            else:
                started(spec.route.scope)

        def emit(kind: DecisionKind, **fields: Any) -> None:
            sig = fields.pop("signal", signal)
            route = fields.pop("route", state.route)
            event = CapacityEvent(
                decision=kind,
                operation=spec.operation,
                task_id=spec.task_id,
                run_id=self.run_id,
                provider=route.provider,
                model=route.model,
                scope=fields.pop("scope", route.scope),
                priority=spec.priority,
                **signal_fields(sig),
                attempt=ledger.loop,
                sdk_attempts=ledger.sdk,
                deadline=spec.deadline,
                **fields,
            )
            events.append(event)
            self._emit(event)

        def finish(
            status: Status,
            reason: str,
            *,
            value: Any = None,
            retry_at: datetime | None = None,
        ) -> Outcome:
            succeeded = status.succeeded
            if not succeeded or ledger.loop > 1:
                emit(
                    DecisionKind.SUCCESS_AFTER_RETRY if succeeded else DecisionKind.STOP,
                    status=status.value,
                    reason=reason,
                    next_attempt_at=retry_at,
                )
            outcome = Outcome(
                status=status,
                reason=reason,
                value=value,
                attempts=ledger.snapshot(),
                route=state.route,
                limited_route=state.limited_route if status is Status.DEGRADED else None,
                retry_at=retry_at,
                signal=signal,
                events=tuple(events),
                error=last_error,
                waited_secs=waited,
            )
            for observer in self._observers:
                observer.call_finished(outcome)
            return outcome

        def wait_for(seconds: float, kind: DecisionKind, route: Route, reason: str) -> Sleep:
            nonlocal waited
            waited += seconds
            emit(
                kind,
                route=route,
                wait_seconds=seconds,
                next_attempt_at=clock.now() + timedelta(seconds=seconds),
                reason=reason,
            )
            return Sleep(seconds)

        while True:
            step = decide(state, None, policy, clock.monotonic())
            if isinstance(step, Stop):
                return finish(step.status, step.reason, retry_at=step.retry_at)
            assert isinstance(step, Proceed)
            route = step.route

            # Admit: reserve capacity on the route before the attempt.
            reservation = None
            if limiter is not None and self._limits_used is not None:
                self._check_limits_keys(route)
            if limiter is not None:
                while True:
                    if isinstance(limiter, Limiter):  # book a start it can afford
                        left = budget.time_left(clock.monotonic())
                        afford = policy.pause_limit_secs if left is None else left
                        # Bookings stay a short way ahead (a few seconds of pacing); a
                        # longer wait polls as before.
                        afford = max(0.0, min(afford, policy.pause_limit_secs, BOOK_HORIZON_SECS))
                        args = (route, spec.cost, spec.priority, afford)
                        granted = yield LimiterCall(limiter, "try_book", args)
                    else:
                        granted = yield Admit(route, spec.cost, spec.priority)
                    if not isinstance(granted, Denied):
                        reservation = granted
                        if getattr(granted, "starts_in", 0.0) > 0:
                            try:
                                why = f"booked capacity on {route.scope}"
                                yield wait_for(
                                    granted.starts_in + ARRIVAL_SLACK_SECS,
                                    DecisionKind.ADMISSION_WAIT,
                                    route,
                                    why,
                                )
                            except BaseException:
                                yield LimiterCall(granted, "release", ())
                                raise
                            if getattr(granted, "stale", False):
                                # The provider refused a call since this was booked (in this
                                # process, or another's, as the backend reported): the
                                # schedule no longer holds, and a refused request would
                                # spend a slot there too.  Give the booking back and ask
                                # again -- an admission wait, not an attempt.
                                yield LimiterCall(granted, "release", ())
                                reservation = None
                                emit(
                                    DecisionKind.ADMISSION_WAIT,
                                    route=route,
                                    wait_seconds=0.0,
                                    reason=f"re-admitting on {route.scope}: a refusal since "
                                    "its booking",
                                )
                                continue
                        break
                    retry_after = granted.retry_after
                    if granted.never_fits:
                        return finish(
                            Status.REJECTED,
                            f"admission refused on {route.scope}: {granted.reason}",
                        )
                    now = clock.monotonic()
                    budget.record_refusal(now)
                    time_left = budget.time_left(now)
                    if retry_after > policy.pause_limit_secs or (
                        time_left is not None and retry_after >= time_left
                    ):
                        why = (
                            f"no capacity on {route.scope} before the deadline, the budget "
                            f"or the pause limit ({granted.reason})"
                        )
                        # Like a server minimum that cannot fit: a fallback may serve now.
                        moved = fall_back_now(state, policy, why)
                        skips = moved.skipped if isinstance(moved, FallBack) else moved
                        for skipped, skip_why in skips:
                            emit(DecisionKind.SKIP, route=skipped, reason=skip_why)
                        if isinstance(moved, FallBack):
                            if state.limited_route is None:
                                state.limited_route, state.limited_kind = route, Kind.TEMPORARY
                            state.index, state.route_attempts = moved.index, 0
                            emit(DecisionKind.FALLBACK, route=moved.route, reason=moved.reason)
                            break
                        return finish(
                            Status.WAITING_FOR_CAPACITY,
                            why,
                            retry_at=clock.now() + timedelta(seconds=retry_after),
                        )
                    yield wait_for(
                        retry_after + ARRIVAL_SLACK_SECS,
                        DecisionKind.ADMISSION_WAIT,
                        route,
                        f"waiting for capacity on {granted.scope}",
                    )
                if reservation is None:  # moved to a fallback: admit on it from the top
                    continue

            # Attempt.
            if not budget.record_attempt():  # another call of the run took the last one
                if reservation is not None:
                    yield LimiterCall(reservation, "release", ())
                return finish(Status.FAILED_RETRY_EXHAUSTED, "the run's attempt budget is spent")
            ledger.record_loop()
            state.route_attempts += 1
            try:
                result = yield Call(route)
            except BaseException:
                # Interrupted inside the attempt (KeyboardInterrupt, task cancelled):
                # give the capacity back before the interruption goes on.
                if reservation is not None:
                    yield LimiterCall(reservation, "release", ())
                raise
            if isinstance(result, Raised):
                last_error = result.error
            retries = sdk_retries(result)
            if retries:
                # They reached the provider: they spend from this call's attempts.
                ledger.record_sdk(retries)
                budget.record_sdk_retries(retries)
                self._warn_sdk_retries(retries)
            try:
                signal = self._signal_of(result)
            except Exception:
                if reservation is not None:
                    yield LimiterCall(reservation, "release", ())
                raise
            now = clock.monotonic()

            # Settle, observe and pause: tell admission what the provider said.
            if reservation is not None:
                if signal.kind is Kind.OK:
                    usage = usage_of(result)
                    if usage is not None:
                        # Read as the provider's accounting profile says (cache reads, ...).
                        yield LimiterCall(reservation, "settle_usage", (usage,))
                    else:
                        yield LimiterCall(
                            reservation,
                            "settle",
                            (spec.cost.input_tokens, spec.cost.output_tokens),
                        )
                else:
                    yield LimiterCall(reservation, "release", ())
            if limiter is not None:
                # The provider speaks for the scope it limits (the project), every tenant included.
                scope = route.provider_scope
                if signal.observed or signal.kind is Kind.TEMPORARY:
                    yield LimiterCall(limiter, "observe", (scope, signal))
                wall = clock.now()
                until = pause_until(signal, wall)
                if until is not None:
                    yield LimiterCall(limiter, "pause", (scope, until, f"{signal.kind.value}"))
                    emit(
                        DecisionKind.PAUSE,
                        scope=scope,
                        paused_until=until,
                        wait_seconds=max(0.0, (until - wall).total_seconds()),
                        reason=f"{signal.kind.value} on {scope}",
                    )

            if signal.kind is Kind.OK:
                value = result.value if isinstance(result, Returned) else None
                stop = decide(state, signal, policy, now)
                assert isinstance(stop, Stop)
                return finish(stop.status, stop.reason, value=value)

            # An exception no classifier recognises is a bug, not a refusal: surface it.
            if (
                isinstance(result, Raised)
                and signal.kind is Kind.UNKNOWN
                and policy.trigger_scope != "all"
            ):
                emit(DecisionKind.STOP, status="raised", reason="unclassified exception")
                raise result.error

            budget.record_refusal(now, signal.kind)

            # Writes: never retry blindly when the effect is unknown.
            if not spec.idempotent and is_ambiguous_failure(signal, result_error(result)):
                if spec.outcome_check is None:
                    return finish(
                        Status.NEEDS_OPERATOR,
                        "unknown_outcome: the write may have taken effect and there is no "
                        "outcome_check",
                    )
                verdict = normalize_write_outcome((yield Check(route)))
                if verdict is WriteOutcome.APPLIED:
                    status = Status.COMPLETED if state.index == 0 else Status.DEGRADED
                    return finish(status, "the write took effect (confirmed by outcome_check)")
                if verdict is WriteOutcome.UNKNOWN or controlled_retry_used:
                    return finish(
                        Status.NEEDS_OPERATOR,
                        "unknown_outcome: outcome_check could not tell whether the write "
                        "took effect"
                        if verdict is WriteOutcome.UNKNOWN
                        else "unknown_outcome: the controlled retry failed ambiguously too",
                    )
                controlled_retry_used = True

            decision = decide(state, signal, policy, now)
            if isinstance(decision, Stop):
                for skipped, why in decision.skipped:
                    emit(DecisionKind.SKIP, route=skipped, reason=why)
                stop_at = decision.retry_at
                if stop_at is None and decision.retry_in is not None:
                    stop_at = clock.now() + timedelta(seconds=decision.retry_in)
                reason = decision.reason
                if decision.skipped:  # a fallback that was never tried says why
                    reason += "; skipped " + "; ".join(
                        f"{r.scope} ({why})" for r, why in decision.skipped
                    )
                return finish(decision.status, reason, retry_at=stop_at)
            if isinstance(decision, Wait):
                yield wait_for(decision.seconds, DecisionKind.WAIT, route, decision.reason)
                state.waits += 1
                state.previous_wait = decision.seconds
                emit(DecisionKind.RETRY, reason=f"retry {state.waits} on {route.scope}")
                continue
            assert isinstance(decision, FallBack)
            for skipped, why in decision.skipped:
                emit(DecisionKind.SKIP, route=skipped, reason=why)
            if signal.kind in (Kind.PERIOD_QUOTA, Kind.SPEND):
                state.spent_providers.add(route.provider)
            if state.limited_route is None:
                state.limited_route = route
                state.limited_kind = signal.kind
            if decision.wait > 0:
                yield wait_for(decision.wait, DecisionKind.WAIT, route, decision.reason)
            state.waits += 1
            state.previous_wait = decision.wait
            state.index = decision.index
            state.route_attempts = 0
            emit(DecisionKind.FALLBACK, route=decision.route, reason=decision.reason)

    def _check_limits_keys(self, route: Route) -> None:
        """Warn once when a route matches no configured limits key while a key matched none.

        A key such as ``openai:gpt-4.1`` written for a route that is really
        ``openai:gpt-4.1-2025-04-14`` would otherwise leave every call unlimited, silently.
        """
        used = self._limits_used
        limits = getattr(self.limiter, "limits", None)
        if used is None or not isinstance(limits, Mapping) or not limits:
            self._limits_used = None
            return
        matched = [s for s in route.scopes if s in limits]
        used.update(matched)
        unused = sorted(set(limits) - used)
        if not unused:
            self._limits_used = None  # every key has served a call: nothing left to check
        elif not matched:
            self._limits_used = None
            warnings.warn(
                f"no [limits] key matches the route {route.scope} (its scopes: "
                f"{', '.join(route.scopes)}), and the key(s) {', '.join(unused)} matched no "
                "call so far: calls on this route are not limited by them",
                LimitsWarning,
                stacklevel=4,
            )

    def _warn_sdk_retries(self, retries: int) -> None:
        if self._warned_sdk_retries:
            return
        self._warned_sdk_retries = True
        warnings.warn(
            f"an SDK retried {retries} time(s) inside one rateloop attempt; those requests "
            "count against max_attempts. Build the client with max_retries=0 (or "
            "rateloop.integrations.sdk.openai_client() / anthropic_client()) so that "
            "rateloop alone decides when to retry",
            SdkRetriesWarning,
            stacklevel=4,
        )

    @staticmethod
    def _raise_unless_ok(outcome: Outcome, policy: Policy, *, soft: bool = True) -> Outcome:
        """Return a successful outcome; otherwise raise, with the original error chained.

        An outcome about the request itself (``invalid``, ``permission``)
        re-raises the provider's own exception.  ``soft`` lets a
        ``failed_retry_exhausted`` outcome through under ``on_exhausted =
        "soft"`` (``call_or_raise``); ``wrap`` never does, since its caller
        would read the missing value as a result.
        """
        if outcome.ok:
            return outcome
        if (
            soft
            and outcome.status is Status.FAILED_RETRY_EXHAUSTED
            and policy.on_exhausted == "soft"
        ):
            return outcome
        error = outcome.error
        signal = outcome.signal
        if error is not None and signal is not None and signal.kind in _NOT_CAPACITY:
            raise error
        raise RateLimitExhausted(outcome) from error
