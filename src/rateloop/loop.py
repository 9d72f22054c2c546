"""The RATE loop drivers: :class:`RateLoop` (sync) and :class:`AsyncRateLoop` (asyncio).

How it works: one generator, :func:`_drive`, holds the whole algorithm of a
call — admit, attempt, classify, decide, wait, fall back, settle, record.  It
never does I/O itself.  Whenever it needs the outside world it *yields an
effect* (``Admit``, ``Call``, ``Sleep``, ``LimiterCall``, ``Check``) and
receives the result.  :class:`RateLoop` carries the effects out with blocking
calls, :class:`AsyncRateLoop` with ``await``; that is the only difference
between the twins (the pattern of httpx's ``auth_flow``).  The decisions
themselves come from the sans-IO :func:`rateloop.decision.decide`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, ParamSpec, TypedDict, TypeVar, Unpack, cast

from rateloop._clock import Clock, system_clock
from rateloop._effects import (
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
from rateloop.admission.reservation import Denied
from rateloop.budget import CallBudget, RunBudget
from rateloop.classify import classify_exception, classify_response
from rateloop.decision import FallBack, LoopState, Proceed, Stop, Wait, decide
from rateloop.errors import RateLimitExhausted
from rateloop.events import CapacityEvent, DecisionKind, EventSink, signal_fields
from rateloop.fallback import build_chain
from rateloop.integrations.sdk import counting_requests
from rateloop.outcome import AttemptLedger, Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.signal import Kind, LimitSignal
from rateloop.writes import WriteOutcome, is_ambiguous_failure, normalize_write_outcome

__all__ = ["AsyncRateLoop", "CallOptions", "RateLoop"]

_Flow = Generator[Effect, Any, Outcome]

P = ParamSpec("P")
T = TypeVar("T")

Priority = Literal["interactive", "scheduled", "background"]
Classifier = Callable[[BaseException], LimitSignal]


class CallOptions(TypedDict, total=False):
    """The keyword options of :meth:`RateLoop.call` (all optional)."""

    cost: Cost | None
    operation: str
    idempotent: bool
    idempotency_key: str | None
    outcome_check: Callable[[Route], Any] | None
    deadline: datetime | float | None
    fallbacks: Sequence[Route] | None
    priority: Priority
    data_class: str | None
    task_id: str | None


_OPTION_NAMES = frozenset(CallOptions.__annotations__)


@dataclass(frozen=True, slots=True, kw_only=True)
class _CallSpec:
    """One call's arguments, checked, as the generator and the drivers see them."""

    route: Route
    fallbacks: tuple[Route, ...]
    cost: Cost
    operation: str
    idempotent: bool
    fn_kwargs: dict[str, Any]
    outcome_check: Callable[[Route], Any] | None
    deadline: datetime | None
    priority: str
    data_class: str | None
    task_id: str | None


# --- the shared base -------------------------------------------------------------


class _BaseRateLoop:
    """Configuration and the algorithm shared by both drivers."""

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        limiter: Any = None,
        clock: Clock | None = None,
        sinks: Sequence[EventSink] = (),
        classify: Classifier | None = None,
        run_budget: RunBudget | None = None,
        run_id: str | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self.policy = policy if policy is not None else Policy()
        self.limiter = limiter
        self.clock = clock if clock is not None else system_clock
        self.sinks = tuple(sinks)
        self.classify = classify
        self.run_budget = run_budget
        self.run_id = run_id
        self._rng = rng

    def __repr__(self) -> str:
        limiter = type(self.limiter).__name__ if self.limiter is not None else None
        return f"{type(self).__name__}(policy=..., limiter={limiter}, clock={self.clock!r})"

    def _spec(self, route: Route, options: CallOptions) -> _CallSpec:
        unknown = set(options) - _OPTION_NAMES
        if unknown:
            raise TypeError(
                f"unknown call option(s) {', '.join(sorted(unknown))}; "
                f"allowed: {', '.join(sorted(_OPTION_NAMES))}"
            )
        if not isinstance(route, Route):
            raise TypeError(f"route must be a rateloop.Route, got {route!r}")
        priority = options.get("priority", "interactive")
        if priority not in ("interactive", "scheduled", "background"):
            raise ValueError(
                f"priority must be 'interactive', 'scheduled' or 'background', got {priority!r}"
            )
        fallbacks = options.get("fallbacks")
        if fallbacks is None:
            fallbacks = self.policy.fallback.routes
        deadline = options.get("deadline")
        if isinstance(deadline, int | float) and not isinstance(deadline, bool):
            deadline = self.clock.now() + timedelta(seconds=float(deadline))
        elif deadline is not None and (
            not isinstance(deadline, datetime) or deadline.tzinfo is None
        ):
            raise ValueError(
                f"deadline must be an aware datetime or seconds from now, got {deadline!r}"
            )
        key = options.get("idempotency_key")
        cost = options.get("cost")
        return _CallSpec(
            route=route,
            fallbacks=tuple(fallbacks),
            cost=cost if cost is not None else Cost(),
            operation=options.get("operation", "model.generate"),
            idempotent=options.get("idempotent", True),
            fn_kwargs={"idempotency_key": key} if key is not None else {},
            outcome_check=options.get("outcome_check"),
            deadline=deadline,
            priority=priority,
            data_class=options.get("data_class"),
            task_id=options.get("task_id"),
        )

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

    def _drive(self, spec: _CallSpec) -> _Flow:
        """The RATE loop for one call, as a generator of effects."""
        clock, policy = self.clock, self.policy
        start = clock.monotonic()
        wall0 = clock.now()
        deadline_mono = (
            start + (spec.deadline - wall0).total_seconds() if spec.deadline is not None else None
        )
        budget = CallBudget(
            max_attempts=policy.max_attempts,
            recovery_budget_secs=policy.recovery_budget_secs,
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
        controlled_retry_used = False

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
                scope=route.scope,
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
            return Outcome(
                status=status,
                reason=reason,
                value=value,
                attempts=ledger.snapshot(),
                route=state.route,
                limited_route=state.limited_route if status is Status.DEGRADED else None,
                retry_at=retry_at,
                signal=signal,
                events=tuple(events),
            )

        def wait_for(seconds: float, kind: DecisionKind, route: Route, reason: str) -> Sleep:
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
            if self.limiter is not None:
                while True:
                    granted = yield Admit(route, spec.cost, spec.priority)
                    if not isinstance(granted, Denied):
                        reservation = granted
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
                        retry_at = clock.now() + timedelta(seconds=retry_after)
                        return finish(
                            Status.WAITING_FOR_CAPACITY,
                            f"no capacity on {route.scope} before the deadline or budget "
                            f"({granted.reason})",
                            retry_at=retry_at,
                        )
                    yield wait_for(
                        retry_after,
                        DecisionKind.ADMISSION_WAIT,
                        route,
                        f"waiting for capacity on {granted.scope}",
                    )

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
            ledger.record_sdk(sdk_retries(result))
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
                        yield LimiterCall(reservation, "settle", usage)
                    else:
                        yield LimiterCall(
                            reservation,
                            "settle",
                            (spec.cost.input_tokens, spec.cost.output_tokens),
                        )
                else:
                    yield LimiterCall(reservation, "release", ())
            if self.limiter is not None:
                # The provider speaks for the scope it limits (the project), every tenant included.
                scope = route.provider_scope
                if signal.observed or signal.kind is Kind.TEMPORARY:
                    yield LimiterCall(self.limiter, "observe", (scope, signal))
                until = pause_until(signal, clock.now())
                if until is not None:
                    yield LimiterCall(self.limiter, "pause", (scope, until, f"{signal.kind.value}"))

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

            budget.record_refusal(now)

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
                return finish(decision.status, decision.reason, retry_at=stop_at)
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

    @staticmethod
    def _raise_unless_ok(outcome: Outcome, policy: Policy) -> Outcome:
        if outcome.ok:
            return outcome
        if outcome.status is Status.FAILED_RETRY_EXHAUSTED and policy.on_exhausted == "soft":
            return outcome
        raise RateLimitExhausted(outcome)


# --- the sync driver ---------------------------------------------------------------


class RateLoop(_BaseRateLoop):
    """The synchronous RATE loop.

    >>> from rateloop import RateLoop, Route
    >>> loop = RateLoop()
    >>> outcome = loop.call(lambda route: "hi", route=Route(provider="openai", model="gpt-5"))
    >>> outcome.status.value, outcome.value
    ('completed', 'hi')
    """

    def call(
        self, fn: Callable[..., Any], *, route: Route, **options: Unpack[CallOptions]
    ) -> Outcome:
        """Run ``fn(route)`` through the RATE loop and return its :class:`Outcome`.

        ``fn`` receives the route of the current attempt (a fallback changes the
        model) and, when ``idempotency_key`` is given, ``idempotency_key=`` too.
        Options: ``cost``, ``operation="model.generate"``, ``idempotent=True``,
        ``idempotency_key``, ``outcome_check``, ``deadline`` (an aware datetime or
        seconds from now), ``fallbacks``, ``priority="interactive"``,
        ``data_class``, ``task_id``.
        """
        spec = self._spec(route, options)
        flow = self._drive(spec)
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = flow.send(result) if error is None else flow.throw(error)
            except StopIteration as stop:
                return cast(Outcome, stop.value)
            try:
                result, error = self._perform(effect, fn, spec), None
            except BaseException as exc:  # the flow decides what to clean up, then re-raises
                result, error = None, exc

    def call_or_raise(
        self, fn: Callable[..., Any], *, route: Route, **options: Unpack[CallOptions]
    ) -> Outcome:
        """Like :meth:`call`, but raise :class:`RateLimitExhausted` unless the work was done.

        With ``on_exhausted = "soft"`` a ``failed_retry_exhausted`` outcome is
        returned instead of raised.
        """
        return self._raise_unless_ok(self.call(fn, route=route, **options), self.policy)

    def wrap(
        self, *, route: Route, **options: Unpack[CallOptions]
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Decorator form: ``fn(route, *args, **kwargs)`` runs through the loop.

        The decorated function returns ``fn``'s value, or raises
        :class:`RateLimitExhausted` carrying the outcome.
        """

        def decorate(fn: Callable[..., T]) -> Callable[P, T]:
            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                def attempt(r: Route, **extra: Any) -> T:
                    return fn(r, *args, **kwargs, **extra)

                outcome = self.call_or_raise(attempt, route=route, **options)
                return cast(T, outcome.value)

            return wrapper

        return decorate

    def _perform(self, effect: Effect, fn: Callable[..., Any], spec: _CallSpec) -> Any:
        if isinstance(effect, Call):
            with counting_requests() as sent:
                try:
                    value = fn(effect.route, **spec.fn_kwargs)
                except Exception as exc:
                    return Raised(exc, sent[0])
            if inspect.isawaitable(value):
                close = getattr(value, "close", None)
                if close is not None:
                    close()  # never leave a coroutine un-awaited behind the error
                raise TypeError(
                    "RateLoop.call got a coroutine function; use AsyncRateLoop for async code"
                )
            return Returned(value, sent[0])
        if isinstance(effect, Sleep):
            self.clock.sleep(effect.seconds)
            return None
        if isinstance(effect, Admit):
            return self.limiter.try_reserve(effect.route, effect.cost, priority=effect.priority)
        if isinstance(effect, LimiterCall):
            return getattr(effect.target, effect.method)(*effect.args)
        assert spec.outcome_check is not None
        return spec.outcome_check(effect.route)


# --- the async driver --------------------------------------------------------------


class AsyncRateLoop(_BaseRateLoop):
    """The asyncio RATE loop; ``fn`` may be a coroutine function or a plain one."""

    async def call(
        self, fn: Callable[..., Any], *, route: Route, **options: Unpack[CallOptions]
    ) -> Outcome:
        """Await ``fn(route)`` through the RATE loop; see :meth:`RateLoop.call`."""
        spec = self._spec(route, options)
        flow = self._drive(spec)
        result: Any = None
        error: BaseException | None = None
        while True:
            try:
                effect = flow.send(result) if error is None else flow.throw(error)
            except StopIteration as stop:
                return cast(Outcome, stop.value)
            try:
                result, error = await self._perform(effect, fn, spec), None
            except BaseException as exc:  # the flow decides what to clean up, then re-raises
                result, error = None, exc

    async def call_or_raise(
        self, fn: Callable[..., Any], *, route: Route, **options: Unpack[CallOptions]
    ) -> Outcome:
        """Like :meth:`call`, but raise :class:`RateLimitExhausted` unless the work was done."""
        return self._raise_unless_ok(await self.call(fn, route=route, **options), self.policy)

    def wrap(
        self, *, route: Route, **options: Unpack[CallOptions]
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """Decorator form for coroutine functions; see :meth:`RateLoop.wrap`."""

        def decorate(fn: Callable[..., Awaitable[T]]) -> Callable[P, Awaitable[T]]:
            @functools.wraps(fn)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                def attempt(r: Route, **extra: Any) -> Awaitable[T]:
                    return fn(r, *args, **kwargs, **extra)

                outcome = await self.call_or_raise(attempt, route=route, **options)
                return cast(T, outcome.value)

            return wrapper

        return decorate

    async def _perform(self, effect: Effect, fn: Callable[..., Any], spec: _CallSpec) -> Any:
        if isinstance(effect, Call):
            with counting_requests() as sent:
                try:
                    value = fn(effect.route, **spec.fn_kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                except Exception as exc:
                    return Raised(exc, sent[0])
            return Returned(value, sent[0])
        if isinstance(effect, Sleep):
            await self.clock.asleep(effect.seconds)
            return None
        if isinstance(effect, Admit):
            return await self.limiter.atry_reserve(
                effect.route, effect.cost, priority=effect.priority
            )
        if isinstance(effect, LimiterCall):
            return await getattr(effect.target, "a" + effect.method)(*effect.args)
        assert spec.outcome_check is not None
        verdict = spec.outcome_check(effect.route)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return verdict
