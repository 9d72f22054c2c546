"""The RATE loop drivers: :class:`RateLoop` (sync) and :class:`AsyncRateLoop` (asyncio).

How it works: one flow, ``_BaseRateLoop._drive`` (in :mod:`rateloop.loop.flow`),
holds the whole algorithm of a call — admit, attempt, classify, decide, wait,
fall back, settle, record.  It never does I/O itself.  Whenever it needs the
outside world it *yields an effect* of the closed vocabulary of
:mod:`rateloop.loop.effects` (``Reserve``, ``Book``, ``Release``, ``Settle``,
``SettleUsage``, ``Observe``, ``Pause``, ``Call``, ``Sleep``, ``OutcomeCheck``) and
receives the result.  :class:`RateLoop` performs each by its type with a
blocking call, :class:`AsyncRateLoop` with ``await``; that is the only
difference between the twins (the pattern of httpx's ``auth_flow`` and
``_send_handling_auth``).  The decisions themselves come from the sans-IO
:func:`rateloop.timing.decide.decide`; the arguments are checked in
:mod:`rateloop.loop.args`.

Customising the loop -- two public hooks, no subclassing:

- ``keep_reservation=(fn, reservation) -> bool``: asked before the loop settles
  the reservation of an attempt that succeeded.  Returning True takes the
  reservation over: the hook's owner settles or releases it later (the httpx
  transport hands it to a response stream, which settles it from the usage it
  saw when it closes).
- :meth:`RateLoop.like` / :meth:`RateLoop.replace`: a loop built like another,
  with some arguments changed (another policy, classifier or hook); ``like``
  also turns a blocking loop into its asyncio twin.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, Unpack, assert_never, cast

from rateloop.loop.args import CallOptions, CallSpec, Priority
from rateloop.loop.effects import (
    Book,
    Call,
    Effect,
    Observe,
    OutcomeCheck,
    Pause,
    Raised,
    Release,
    Reserve,
    Returned,
    Settle,
    SettleUsage,
    Sleep,
)
from rateloop.loop.flow import _BaseRateLoop
from rateloop.loop.sdk_count import counting_requests
from rateloop.outcome.record import Outcome
from rateloop.route import Route

__all__ = ["AsyncRateLoop", "CallOptions", "Priority", "RateLoop"]

P = ParamSpec("P")
T = TypeVar("T")


# --- the sync driver ---------------------------------------------------------------


class RateLoop(_BaseRateLoop):
    """The synchronous RATE loop.

    >>> from rateloop import RateLoop, Route
    >>> loop = RateLoop()
    >>> outcome = loop.call(lambda route: "hi", route=Route(provider="openai", model="gpt-5"))
    >>> outcome.status.value, outcome.value
    ('completed', 'hi')

    Customise it through its public hooks, never by subclassing (docs/loop.md,
    "Customising the loop"):

    - ``keep_reservation=(fn, reservation) -> bool`` is asked, with the
      attempt callable, before the reservation of an attempt that succeeded
      is settled; True takes it over (its owner settles or releases it later,
      as the httpx transport's response streams do).
    - :meth:`like` / :meth:`replace` build a loop with this one's arguments
      (:meth:`options`) and some changed; ``AsyncRateLoop.like(loop)`` is its
      asyncio twin.

    >>> strict = loop.replace(keep_reservation=lambda fn, reservation: False)
    >>> strict.policy is loop.policy, type(strict).__name__
    (True, 'RateLoop')
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
        """Like :meth:`call`, but raise unless the work was done.

        Raises :class:`RateLimitExhausted` (``raise ... from`` the last
        exception, kept as ``outcome.error``), or for ``invalid`` and
        ``permission`` the provider's own exception.  With ``on_exhausted =
        "soft"`` a ``failed_retry_exhausted`` outcome is returned instead.
        """
        return self._raise_unless_ok(self.call(fn, route=route, **options), self.policy)

    def wrap(
        self, *, route: Route, **options: Unpack[CallOptions]
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """Decorator form: ``fn(route, *args, **kwargs)`` runs through the loop.

        The decorated function returns ``fn``'s value, or raises: the
        provider's own exception for ``invalid`` and ``permission``,
        otherwise :class:`RateLimitExhausted` carrying the outcome, chained
        to the last exception.  ``on_exhausted = "soft"`` does not apply
        here: a decorated function has no outcome to return, and ``None``
        would pass for a result.
        """

        def decorate(fn: Callable[..., T]) -> Callable[P, T]:
            @functools.wraps(fn)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
                def attempt(r: Route, **extra: Any) -> T:
                    return fn(r, *args, **kwargs, **extra)

                outcome = self._raise_unless_ok(
                    self.call(attempt, route=route, **options), self.policy, soft=False
                )
                return cast(T, outcome.value)

            return wrapper

        return decorate

    def _perform(self, effect: Effect, fn: Callable[..., Any], spec: CallSpec) -> Any:
        limiter = self.limiter
        match effect:
            case Call(route):
                with counting_requests() as sent:
                    try:
                        value = fn(route, **spec.fn_kwargs)
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
            # The rest by how often a call meets them: book, settle, release first.
            case Book(route, cost, priority, within):
                return limiter.try_book(route, cost, priority, within)
            case Settle(reservation, input_tokens, output_tokens):
                if self._kept(fn, reservation):
                    return None
                return reservation.settle(input_tokens, output_tokens)
            case SettleUsage(reservation, usage):
                if self._kept(fn, reservation):
                    return None
                return reservation.settle_usage(usage)
            case Release(reservation):
                return reservation.release()
            case Sleep(seconds):
                return self.clock.sleep(seconds)
            case Reserve(route, cost, priority):
                return limiter.try_reserve(route, cost, priority=priority)
            case Observe(scope, signal):
                return limiter.observe(scope, signal)
            case Pause(scope, until, reason):
                return limiter.pause(scope, until, reason)
            case OutcomeCheck(route):
                assert spec.outcome_check is not None
                return spec.outcome_check(route)
        assert_never(effect)


# --- the async driver --------------------------------------------------------------


class AsyncRateLoop(_BaseRateLoop):
    """The asyncio RATE loop; ``fn`` may be a coroutine function or a plain one."""

    _is_async = True

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

                outcome = self._raise_unless_ok(
                    await self.call(attempt, route=route, **options), self.policy, soft=False
                )
                return cast(T, outcome.value)

            return wrapper

        return decorate

    async def _perform(self, effect: Effect, fn: Callable[..., Any], spec: CallSpec) -> Any:
        limiter = self.limiter
        match effect:
            case Call(route):
                with counting_requests() as sent:
                    try:
                        value = fn(route, **spec.fn_kwargs)
                        if inspect.isawaitable(value):
                            value = await value
                    except Exception as exc:
                        return Raised(exc, sent[0])
                return Returned(value, sent[0])
            # The rest by how often a call meets them: book, settle, release first.
            case Book(route, cost, priority, within):
                return await limiter.atry_book(route, cost, priority, within)
            case Settle(reservation, input_tokens, output_tokens):
                if self._kept(fn, reservation):
                    return None
                return await reservation.asettle(input_tokens, output_tokens)
            case SettleUsage(reservation, usage):
                if self._kept(fn, reservation):
                    return None
                return await reservation.asettle_usage(usage)
            case Release(reservation):
                return await reservation.arelease()
            case Sleep(seconds):
                return await self.clock.asleep(seconds)
            case Reserve(route, cost, priority):
                return await limiter.atry_reserve(route, cost, priority=priority)
            case Observe(scope, signal):
                return await limiter.aobserve(scope, signal)
            case Pause(scope, until, reason):
                return await limiter.apause(scope, until, reason)
            case OutcomeCheck(route):
                assert spec.outcome_check is not None
                verdict = spec.outcome_check(route)
                return await verdict if inspect.isawaitable(verdict) else verdict
        assert_never(effect)
