"""The effects of the RATE loop: what its flow asks a driver to do, and what comes back.

The loop's flow (:mod:`rateloop.loop.flow`) never does I/O: it yields one of
these values and receives the result.  The vocabulary is closed and typed
(the drivers dispatch on the type, never on a method name):

- :class:`Reserve` -- ``limiter.try_reserve(route, cost, priority=...)``: a
  reservation, or a ``Denied``;
- :class:`Book` -- ``Limiter.try_book(route, cost, priority, within)``: the same,
  possibly for a start up to ``within`` seconds ahead;
- :class:`Release` -- ``reservation.release()``;
- :class:`Settle` -- ``reservation.settle(input_tokens, output_tokens)``;
- :class:`SettleUsage` -- ``reservation.settle_usage(usage)``; before either
  settle the driver asks the loop's ``keep_reservation`` hook, which may take
  the reservation over instead;
- :class:`Observe` -- ``limiter.observe(scope, signal)``;
- :class:`Pause` -- ``limiter.pause(scope, until, reason)``;
- :class:`Call` -- the attempt, ``fn(route, ...)``: :class:`Returned` or
  :class:`Raised`;
- :class:`Sleep` -- ``clock.sleep(seconds)``;
- :class:`OutcomeCheck` -- the call's ``outcome_check(route)``: its verdict.

Every other effect's result is None.  :class:`~rateloop.loop.RateLoop`
performs them with blocking calls, :class:`~rateloop.loop.AsyncRateLoop`
awaits the ``a``-prefixed twin of each.  The helpers below read what an
attempt's result says about SDK retries, token usage and pauses; they are
shared by both drivers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rateloop.admission.profile import profile_for, reports_tokens, usage_charge
from rateloop.loop.sdk_count import sdk_retries_taken
from rateloop.route import TIERS, Cost, Route
from rateloop.signal import Kind, LimitSignal

#: How Read names the capacity pool of a service tier (``tier:flex``: OpenAI's flex).
TIER_SCOPE_PREFIX = "tier:"

__all__ = [
    "TIER_SCOPE_PREFIX",
    "Book",
    "Call",
    "Effect",
    "Observe",
    "OutcomeCheck",
    "Pause",
    "Raised",
    "Release",
    "Reserve",
    "Returned",
    "Settle",
    "SettleUsage",
    "Sleep",
    "observed_scope",
    "pause_until",
    "result_error",
    "sdk_retries",
    "served_cost_usd",
    "usage_of",
]


@dataclass(frozen=True, slots=True)
class Reserve:
    """Ask the limiter for capacity now (``try_reserve``): the limiter contract's own call."""

    route: Route
    cost: Cost
    priority: str


@dataclass(frozen=True, slots=True)
class Book:
    """Ask a :class:`~rateloop.admission.Limiter` for a start up to ``within`` seconds ahead."""

    route: Route
    cost: Cost
    priority: str
    within: float


@dataclass(frozen=True, slots=True)
class Release:
    """Give a reservation back whole: a refusal, an interruption, a voided booking."""

    reservation: Any


@dataclass(frozen=True, slots=True)
class Settle:
    """Settle a successful attempt's reservation with its tokens (the estimate)."""

    reservation: Any
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class SettleUsage:
    """Settle a successful attempt's reservation with the usage its response reports."""

    reservation: Any
    usage: Any


@dataclass(frozen=True, slots=True)
class Observe:
    """Tell the limiter what the provider said about ``scope`` (headers, a throttle)."""

    scope: str
    signal: LimitSignal


@dataclass(frozen=True, slots=True)
class Pause:
    """Hold ``scope`` for every worker until ``until``."""

    scope: str
    until: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class Call:
    """Run the attempt on ``route``."""

    route: Route


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class OutcomeCheck:
    """Ask the call's ``outcome_check`` whether an ambiguous write took effect on ``route``."""

    route: Route


@dataclass(frozen=True, slots=True)
class Returned:
    value: Any
    requests: int = 0  # requests counted by helper-built SDK clients during the attempt


@dataclass(frozen=True, slots=True)
class Raised:
    error: BaseException
    requests: int = 0


#: The closed vocabulary: a driver handles each of these and nothing else.
Effect = (
    Reserve | Book | Release | Settle | SettleUsage | Observe | Pause | Call | Sleep | OutcomeCheck
)


def observed_scope(signal: LimitSignal, route: Route) -> str:
    """The scope a signal speaks for: where the loop observes it and pauses.

    The route's provider scope (``provider:model[:project]``); for a refusal
    of a tier's own capacity (``tier:flex``) the same at that tier
    (``openai:gpt-5~flex:proj``); unless the signal came from another
    provider than the route's -- a tool the call
    used, such as GitHub answering inside a model step -- and names a scope
    off the route's path (``tool:github:core``): then that scope, so that a
    tool's limit never pauses the model.  A scope on the route's path (a
    model's organisation-wide limit) is left to the limiter's own binding
    rule (:mod:`rateloop.admission.feedback`).
    """
    own = route.provider_scope
    named = signal.scope
    if named and named.startswith(TIER_SCOPE_PREFIX):
        # A tier's own capacity refused (flex): the route's scope at that tier, never the
        # standard tier's, whoever named it.
        tier = named[len(TIER_SCOPE_PREFIX) :]
        return route.with_tier(tier).provider_scope if tier in TIERS else own
    if not named or signal.provider == route.provider:
        return own
    if own == named or own.startswith(named + ":") or named.startswith(own + ":"):
        return own  # on the route's path: the route is the tool's own, or names a wider limit
    return named


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


def served_cost_usd(route: Route, usage: Any | None, cost: Cost, discount: float) -> float | None:
    """What a served call cost on ``route``: the reported ``usage``, else the reserved ``cost``.

    Tokens as the provider's accounting counts them (cache discounts are not
    applied), at the route's prices less ``discount`` (its tier's).  Shared by
    the loop and a task step served on the batch rung (:mod:`rateloop.tasks.batch_rung`).

    >>> route = Route(provider="openai", model="m", input_price_per_mtok=2.0,
    ...               output_price_per_mtok=8.0)
    >>> served_cost_usd(route, {"prompt_tokens": 1000, "completion_tokens": 500}, Cost(), 0.5)
    0.003
    """
    if usage is not None:
        tokens = usage_charge(profile_for(route.provider), usage)
    else:
        tokens = (cost.input_tokens, cost.output_tokens)
    return route.price_usd(*tokens, discount=discount)


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

