"""The sans-IO decider of the RATE loop.

How it works: after every attempt the driver classifies what came back into
a :class:`~rateloop.signal.LimitSignal` and asks :func:`decide` what to do,
passing the loop's :class:`LoopState`, the policy and the monotonic time.
``decide`` reads and returns values only; it never sleeps, calls or reads a
clock.  It answers with one of four decisions:

- :class:`Proceed` — attempt now, on this route (the first attempt, or a
  retry whose wait has already been served);
- :class:`Wait` — wait ``seconds``, then retry the same route;
- :class:`FallBack` — wait ``wait`` seconds by the backoff, then try the next
  eligible route of the chain;
- :class:`Stop` — end the call with an explicit :class:`~rateloop.outcome.Status`.

The rules, in order:

0. Before an attempt (no signal yet): ``Proceed`` while the attempt budget
   lasts and the caller's deadline has not passed.
1. ``ok`` ends the call: ``completed`` on the primary, ``degraded`` on a fallback.
2. ``period_quota`` and ``spend`` never retry the same route.  Outside the
   ``rate-limit`` scope they move at once (no backoff: it has refused nothing)
   to a fallback on *another provider*;
   otherwise ``waiting_for_reset`` (period quota, with ``retry_at``) or
   ``needs_operator`` (spend).
3. A kind outside the policy's ``trigger_scope`` is surfaced as it is:
   ``invalid``, ``needs_operator`` (permission), or ``failed_retry_exhausted``
   with a reason saying it was not retried.
4. A kind inside the scope is retried while the attempt budget lasts
   (attempts as the provider saw them: SDK retries count): on the same
   route while it has attempts left, else on the next eligible route.  A
   route's attempts are ``attempts_per_route``; unset, each route of a chain
   but the last gets :func:`default_attempts_per_route` (5, fewer when
   ``max_attempts`` is small, and only while an eligible route follows), and
   the last route, or a lone one, every attempt left.
5. A server minimum (Retry-After, reset header) is a floor on a same-route
   wait.  When it does not fit the pause limit, the recovery budget or the
   deadline, the call moves at once (no wait) to the next eligible route;
   with none, it stops ``waiting_for_capacity`` with the time to retry at,
   without sleeping.
6. No sleep is longer than ``pause_limit_secs``: a backoff step of our own
   beyond it is capped at it (our backoff is a guess; the pause limit is the
   longest the caller agreed to be held).  A backoff wait that does not fit
   the loop's own budgets (recovery, ``max_wait_secs``) is shortened to what
   is left of them; with nothing left the call is ``failed_retry_exhausted``.
7. No wait that would end at or after the caller's deadline is taken.  When
   the wait's floor (the server minimum, or the least our jitter could draw)
   ends before the deadline, the jitter is clamped into the room left (at
   most half of it, keeping the rest for the attempt); otherwise the call
   stops ``waiting_for_capacity``.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from rateloop.outcome.record import Status
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.signal import Kind, LimitSignal
from rateloop.timing.backoff import Backoff, plan_wait
from rateloop.timing.budget import CallBudget
from rateloop.timing.fallback import check_route

__all__ = [
    "DEFAULT_ATTEMPTS_PER_ROUTE",
    "TRIGGER_SCOPES",
    "Decision",
    "FallBack",
    "LoopState",
    "Proceed",
    "Stop",
    "Wait",
    "decide",
    "default_attempts_per_route",
    "fall_back_now",
    "in_trigger_scope",
]

#: Which kinds each ``trigger_scope`` acts on (retry or fall back).
TRIGGER_SCOPES: dict[str, frozenset[Kind]] = {
    "rate-limit": frozenset({Kind.TEMPORARY, Kind.OVERLOAD}),
    "transient": frozenset({Kind.TEMPORARY, Kind.OVERLOAD, Kind.SERVER_ERROR, Kind.NETWORK}),
    "all": frozenset(set(Kind) - {Kind.OK, Kind.PERIOD_QUOTA, Kind.SPEND}),
}

Skips = tuple[tuple[Route, str], ...]

#: Attempts per route when a chain has fallbacks and ``attempts_per_route`` is
#: unset: one try and 4 retries, crab'd's default of 4 retries per model.
DEFAULT_ATTEMPTS_PER_ROUTE = 5

# How the outcome of a degraded call names what happened to the primary.
_LIMITED_AS: dict[Kind | None, str] = {
    Kind.TEMPORARY: "was rate-limited",
    Kind.OVERLOAD: "was overloaded",
    Kind.PERIOD_QUOTA: "ran out of its period quota",
    Kind.SPEND: "hit a spend limit",
    Kind.SERVER_ERROR: "failed with a server error",
    Kind.NETWORK: "was unreachable",
}


@dataclass(frozen=True, slots=True)
class Proceed:
    """Attempt now on ``route``."""

    route: Route
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait ``seconds``, then retry ``route`` (the same route)."""

    seconds: float
    reason: str
    route: Route


@dataclass(frozen=True, slots=True)
class FallBack:
    """Wait ``wait`` seconds, then move to ``route`` (chain position ``index``)."""

    route: Route
    wait: float
    reason: str
    index: int
    skipped: Skips = ()


@dataclass(frozen=True, slots=True)
class Stop:
    """End the call.  ``retry_at`` / ``retry_in`` say when it may be worth trying again."""

    status: Status
    reason: str
    retry_at: datetime | None = None
    retry_in: float | None = None
    skipped: Skips = ()


Decision = Proceed | Wait | FallBack | Stop


@dataclass(slots=True, kw_only=True)
class LoopState:
    """Everything the decider needs to know about one call in flight.

    ``epoch`` pairs a monotonic reading with the wall-clock time at that
    reading, so the decider can turn monotonic instants into datetimes without
    reading a clock.
    """

    chain: tuple[Route, ...]
    budget: CallBudget
    backoff: Backoff
    epoch: tuple[float, datetime]
    cost: Cost = field(default_factory=Cost)
    data_class: str | None = None
    index: int = 0
    route_attempts: int = 0
    waits: int = 0
    previous_wait: float | None = None
    limited_route: Route | None = None
    limited_kind: Kind | None = None
    spent_providers: set[str] = field(default_factory=set)

    @property
    def route(self) -> Route:
        return self.chain[self.index]

    def wall(self, now: float) -> datetime:
        mono0, wall0 = self.epoch
        return wall0 + timedelta(seconds=now - mono0)


def in_trigger_scope(kind: Kind, trigger_scope: str) -> bool:
    """True when ``trigger_scope`` retries (or falls back on) ``kind``."""
    try:
        return kind in TRIGGER_SCOPES[trigger_scope]
    except KeyError:
        allowed = ", ".join(TRIGGER_SCOPES)
        raise ValueError(f"unknown trigger_scope {trigger_scope!r} (allowed: {allowed})") from None


def decide(state: LoopState, signal: LimitSignal | None, policy: Policy, now: float) -> Decision:
    """What to do after an attempt on ``state.route`` returned ``signal``.

    With ``signal`` None (no attempt yet on this step) the answer is
    :class:`Proceed` while the attempt budget lasts.
    """
    route = state.route
    if signal is None:
        deadline = state.budget.deadline
        if deadline is not None and now >= deadline:
            return Stop(
                Status.WAITING_FOR_CAPACITY,
                f"the deadline passed before an attempt on {route.scope} could start",
                retry_at=state.wall(now),
            )
        if state.budget.can_attempt():
            return Proceed(route)
        return Stop(
            Status.FAILED_RETRY_EXHAUSTED,
            f"no attempt left in the budget for {route.scope} "
            f"({state.budget.attempts} made by this call)",
        )
    kind = signal.kind
    if kind is Kind.OK:
        if state.index == 0:
            return Stop(Status.COMPLETED, f"completed on {route.scope}")
        limited = state.limited_route or state.chain[0]
        what = _LIMITED_AS.get(state.limited_kind, "was refused")
        return Stop(
            Status.DEGRADED,
            f"Primary model {limited.model} {what} — completed with {route.model}",
        )

    if kind in (Kind.PERIOD_QUOTA, Kind.SPEND):
        exclude = {route.provider, *state.spent_providers}
        if policy.trigger_scope != "rate-limit" and state.budget.can_attempt():
            found = _next_route(state, policy, exclude_providers=exclude)
            if isinstance(found, FallBack):
                # The other provider has refused nothing: no backoff before it.
                reason = (
                    f"{kind.value} on {state.route.scope}; "
                    f"falling back to {found.route.scope} at once"
                )
                return FallBack(found.route, 0.0, reason, found.index, found.skipped)
            skipped = found
        else:
            skipped = ()
        return _stop_for(state, signal, now, skipped=skipped)

    if not in_trigger_scope(kind, policy.trigger_scope):
        return _stop_for(state, signal, now)

    if not state.budget.can_retry(kind):
        budget = state.budget
        if budget.bound_of(kind) == "max_error_attempts":
            why = (
                f"all {budget.error_attempts} attempts for network errors, 5xx and "
                f"overloads used (max_error_attempts {budget.max_error_attempts})"
            )
        else:
            why = f"all {budget.attempts - budget.error_attempts} attempts used" if (
                budget.separate
            ) else f"all {budget.attempts} attempts used"
        return _exhausted(state, signal, why)

    per_route = policy.attempts_per_route
    explicit = per_route is not None
    if not explicit and state.index < len(state.chain) - 1:
        per_route = default_attempts_per_route(policy.max_attempts, len(state.chain))
    if per_route is not None and state.route_attempts >= per_route:
        found = _next_route(state, policy, exclude_providers=state.spent_providers)
        if isinstance(found, FallBack):
            return _fit_fallback(state, policy, now, found, signal)
        if explicit:
            return _exhausted(
                state,
                signal,
                f"every route of the chain was tried ({len(state.chain)} routes)",
                skipped=found,
            )
        # The default bound only moves a call on; with nowhere to go it keeps retrying here.

    step = _wait_same_route(state, signal, policy, now)
    if not (isinstance(step, Stop) and step.status is Status.WAITING_FOR_CAPACITY):
        return step
    # This route's own wait cannot fit: a healthy fallback may still serve the call now.
    moved = fall_back_now(state, policy, step.reason)
    if isinstance(moved, FallBack):
        return moved
    return Stop(
        step.status, step.reason, retry_at=step.retry_at, retry_in=step.retry_in, skipped=moved
    )


def default_attempts_per_route(max_attempts: int, routes: int) -> int:
    """Attempts a route gets before the next when ``attempts_per_route`` is unset.

    :data:`DEFAULT_ATTEMPTS_PER_ROUTE`, but never so many that ``max_attempts``
    runs out before every route of the chain had a turn.  The last route of a
    chain is not bounded by it: there is nowhere left to move on to.

    >>> default_attempts_per_route(20, 2), default_attempts_per_route(6, 3)
    (5, 2)
    """
    return max(1, min(DEFAULT_ATTEMPTS_PER_ROUTE, math.ceil(max_attempts / routes)))


def fall_back_now(state: LoopState, policy: Policy, why: str) -> FallBack | Skips:
    """The next eligible route to move to at once (no wait) because ``why``, or the skips.

    Used when the current route's own wait cannot fit (rule 5), for a server
    minimum and for an admission wait alike.
    """
    found = _next_route(state, policy, exclude_providers=state.spent_providers)
    if not isinstance(found, FallBack):
        return found
    reason = f"{why}; falling back to {found.route.scope} at once"
    return FallBack(found.route, 0.0, reason, found.index, found.skipped)


def _wait_same_route(
    state: LoopState, signal: LimitSignal, policy: Policy, now: float
) -> Wait | Stop:
    minimum = signal.retry_after if signal.retry_after else None
    return _wait_before(state, signal, policy, now, state.route, minimum)


def _fit_fallback(
    state: LoopState, policy: Policy, now: float, found: FallBack, signal: LimitSignal
) -> FallBack | Stop:
    # A server's minimum belongs to the scope that sent it: between routes, the backoff.
    step = _wait_before(state, signal, policy, now, found.route, None)
    if isinstance(step, Stop):
        return Stop(
            step.status,
            step.reason,
            retry_at=step.retry_at,
            retry_in=step.retry_in,
            skipped=found.skipped,
        )
    reason = f"{signal.kind.value} on {state.route.scope}; falling back to {found.route.scope}"
    return FallBack(found.route, step.seconds, reason, found.index, found.skipped)


def _wait_before(
    state: LoopState,
    signal: LimitSignal,
    policy: Policy,
    now: float,
    route: Route,
    minimum: float | None,
) -> Wait | Stop:
    """The wait before the next attempt on ``route``, or why there is none.

    Rules 5-7 of the module: a server minimum that does not fit stops;
    our own backoff is capped at the pause limit and the budget left; the
    jitter is clamped to end before the deadline when the floor fits.
    """
    own_left = _own_budget_left(state.budget, now)
    limit = policy.pause_limit_secs
    n = state.waits + 1
    plan = plan_wait(
        state.backoff,
        n,
        server_minimum=minimum,
        pause_limit=limit,
        time_left=own_left,
        previous=state.previous_wait,
    )
    if plan.fits:
        wait = plan.seconds
        source = f"server asked for {minimum:g}s" if minimum else "backoff"
    elif minimum is not None:
        return Stop(
            Status.WAITING_FOR_CAPACITY,
            plan.reason or f"the server's wait of {minimum:g}s does not fit",
            retry_at=_later(signal.reset_at, state.wall(now + minimum)),
        )
    elif own_left is not None and own_left <= 0:
        return _exhausted(state, signal, "the time budget is spent")
    else:
        # Our own backoff is a guess: cap it at the pause limit and the budget left.
        wait = min(limit, own_left) if own_left is not None else limit
        source = f"backoff capped at {wait:g}s (pause limit {limit:g}s, budget left)"
    deadline = state.budget.deadline
    if deadline is not None and now + wait >= deadline:
        room = deadline - now
        floor = min(minimum if minimum else state.backoff.bounds(n)[0], wait)
        if floor < room:
            # The floor fits before the deadline: clamp only the jitter, never the floor.
            wait = floor + min(wait - floor, (room - floor) / 2)
            source += f", jitter clamped to end before the deadline ({wait:g}s)"
        else:
            return Stop(
                Status.WAITING_FOR_CAPACITY,
                f"a wait of {wait:g}s on {route.scope} would end after the deadline",
                # With a server minimum, that is when capacity returns; the jitter is ours.
                retry_at=(
                    _later(signal.reset_at, state.wall(now + minimum))
                    if minimum
                    else state.wall(now + wait)
                ),
            )
    return Wait(wait, f"{signal.kind.value} on {state.route.scope}; {source}", route)


def _own_budget_left(budget: CallBudget, now: float) -> float | None:
    """Seconds left in the loop's own time budgets (not the caller's deadline)."""
    bounds: list[float] = []
    if budget.first_refusal_at is not None:
        bounds.append(budget.recovery_budget_secs - (now - budget.first_refusal_at))
    if budget.max_wait_secs is not None:
        bounds.append(budget.max_wait_secs - (now - budget.started_at))
    return min(bounds) if bounds else None


def _later(a: datetime | None, b: datetime) -> datetime:
    return b if a is None or a < b else a


def _next_route(
    state: LoopState, policy: Policy, *, exclude_providers: Collection[str]
) -> FallBack | Skips:
    """The next eligible route after the current one, or the skips that left none."""
    fb = policy.fallback
    skipped: list[tuple[Route, str]] = []
    for index in range(state.index + 1, len(state.chain)):
        candidate = state.chain[index]
        why = check_route(
            candidate,
            cost=state.cost,
            allowed_providers=fb.allowed_providers,
            data_class=state.data_class if state.data_class is not None else fb.data_class,
            max_cost_usd=fb.max_cost_usd,
            exclude_providers=exclude_providers,
        )
        if why is None:
            return FallBack(candidate, 0.0, "", index, tuple(skipped))
        skipped.append((candidate, why))
    return tuple(skipped)


def _exhausted(state: LoopState, signal: LimitSignal, why: str, *, skipped: Skips = ()) -> Stop:
    return Stop(
        Status.FAILED_RETRY_EXHAUSTED,
        f"{signal.kind.value} persisted on {state.route.scope}: {why}",
        skipped=skipped,
    )


def _stop_for(state: LoopState, signal: LimitSignal, now: float, *, skipped: Skips = ()) -> Stop:
    """The terminal status for a signal the loop will not retry."""
    kind = signal.kind
    scope = state.route.scope
    if kind is Kind.PERIOD_QUOTA:
        retry_at = signal.reset_at
        if retry_at is None and signal.retry_after is not None:
            retry_at = state.wall(now) + timedelta(seconds=signal.retry_after)
        estimate = ""
        if retry_at is None:
            retry_at = _next_utc_midnight(state.wall(now))
            estimate = " (an estimate: the provider gave no reset time)"
        return Stop(
            Status.WAITING_FOR_RESET,
            f"period quota exhausted on {scope}; resets at {retry_at.isoformat()}{estimate}",
            retry_at=retry_at,
            skipped=skipped,
        )
    if kind is Kind.SPEND:
        return Stop(
            Status.NEEDS_OPERATOR,
            f"spend or billing limit on {scope}: add credit or raise the cap",
            skipped=skipped,
        )
    if kind is Kind.PERMISSION:
        return Stop(
            Status.NEEDS_OPERATOR, f"permission refused on {scope} (status {signal.status})"
        )
    if kind is Kind.INVALID:
        return Stop(Status.INVALID, f"the request was refused as invalid (status {signal.status})")
    return Stop(
        Status.FAILED_RETRY_EXHAUSTED,
        f"{kind.value} on {scope} is outside trigger_scope; not retried",
    )


def _next_utc_midnight(at: datetime) -> datetime:
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, at.day, tzinfo=UTC) + timedelta(days=1)
