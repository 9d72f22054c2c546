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
3a. A connection that never opened (a ``network`` signal whose ``code`` is
   :data:`~rateloop.signal.CONNECT_FAILED`: refused, unknown host, no route)
   to an endpoint that has not answered in this process
   (:class:`~rateloop.timing.state.Answered`) is not retried: it is most
   likely a wrong base URL or a server that is not running.  The call moves
   at once to the next eligible route, or stops ``failed_retry_exhausted``
   saying so.  To an endpoint that has answered, it is a network failure
   like any other (rule 4), as is a connection lost mid-call.
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

Before rule 0, a call whose chain reached the ``batch`` rung of its degrade
ladder ends there, ``waiting_for_capacity`` with ``next_rung="batch"``: the
task layer submits it to the batch API (:mod:`rateloop.timing.ladder`, whose
rule 6 also reads every ``waiting_for_capacity`` stop of a call with a ladder).

Two more questions come from outside an attempt:

8. Admission refused the call (:func:`decide_admission`): a cost that can
   never fit is ``rejected``; a wait for capacity that fits the pause limit
   and the time left is a :class:`Wait` of the limiter's ``retry_after`` (and
   :data:`ARRIVAL_SLACK_SECS`); one that does not fit moves at once to the
   next eligible route (as in rule 5), or stops ``waiting_for_capacity``
   with ``retry_in``.  A start is booked at most :func:`book_within` ahead.
9. A write whose effect is unknown (:func:`decide_write`): with no
   ``outcome_check``, or a check that cannot tell, ``needs_operator``;
   ``applied`` ends the call done; ``not applied`` allows one controlled
   retry, and a second ambiguous failure is ``needs_operator``.

``decide`` and the functions above only read the state; what the loop does
with their answers is recorded by :mod:`rateloop.timing.state`, the one
module that changes it.  They read the few settings of
:class:`~rateloop.timing.state.LoopSettings`, not the whole policy.
"""
from __future__ import annotations

import math
from typing import Protocol

from rateloop.outcome.record import Status
from rateloop.signal import CONNECT_FAILED, Kind, LimitSignal
from rateloop.timing.decision import Decision, FallBack, Proceed, Stop, Wait
from rateloop.timing.exits import completed, exhausted, stop_for
from rateloop.timing.ladder import ladder_end
from rateloop.timing.moves import fall_back_now, next_route
from rateloop.timing.state import LoopSettings, LoopState
from rateloop.timing.waits import wait_before
from rateloop.timing.writes import WriteOutcome

__all__ = [
    "ARRIVAL_SLACK_SECS",
    "BOOK_HORIZON_SECS",
    "DEFAULT_ATTEMPTS_PER_ROUTE",
    "TRIGGER_SCOPES",
    "AdmissionRefusal",
    "Decision",
    "FallBack",
    "LoopSettings",
    "LoopState",
    "Proceed",
    "Stop",
    "Wait",
    "book_within",
    "decide",
    "decide_admission",
    "decide_write",
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

#: Attempts per route when a chain has fallbacks and ``attempts_per_route`` is
#: unset: one try and 4 retries, crab'd's default of 4 retries per model.
DEFAULT_ATTEMPTS_PER_ROUTE = 5

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


class AdmissionRefusal(Protocol):
    """What rule 8 reads of a limiter's refusal (``rateloop.admission.Denied`` has it)."""

    @property
    def retry_after(self) -> float: ...
    @property
    def never_fits(self) -> bool: ...
    @property
    def scope(self) -> str: ...
    @property
    def reason(self) -> str: ...


def in_trigger_scope(kind: Kind, trigger_scope: str) -> bool:
    """True when ``trigger_scope`` retries (or falls back on) ``kind``."""
    try:
        return kind in TRIGGER_SCOPES[trigger_scope]
    except KeyError:
        allowed = ", ".join(TRIGGER_SCOPES)
        raise ValueError(f"unknown trigger_scope {trigger_scope!r} (allowed: {allowed})") from None


def decide(
    state: LoopState, signal: LimitSignal | None, policy: LoopSettings, now: float
) -> Decision:
    """What to do after an attempt on ``state.route`` returned ``signal`` (rules 0-7).

    With ``signal`` None (no attempt yet on this step) the answer is
    :class:`Proceed` while the attempt budget lasts.  ``policy`` is anything
    with the :class:`LoopSettings` fields, a :class:`~rateloop.policy.Policy`
    for one.
    """
    step = _decide(state, signal, policy, now)
    return ladder_end(step, state.ladder) if isinstance(step, Stop) else step


def _decide(
    state: LoopState, signal: LimitSignal | None, policy: LoopSettings, now: float
) -> Decision:
    route = state.route
    if signal is None and route.tier == "batch":
        return Stop(
            Status.WAITING_FOR_CAPACITY,
            f"handed to the batch rung: submit it to {route.provider}'s batch API "
            f"({route.scope})",
            next_rung="batch",
        )
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
        return completed(state)

    if kind in (Kind.PERIOD_QUOTA, Kind.SPEND):
        exclude = {route.provider, *state.spent_providers}
        if policy.trigger_scope != "rate-limit" and state.budget.can_attempt():
            found = next_route(state, policy, exclude_providers=exclude)
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
        return stop_for(state, signal, now, skipped=skipped)

    if not in_trigger_scope(kind, policy.trigger_scope):
        return stop_for(state, signal, now)

    if signal.code == CONNECT_FAILED and route not in state.answered:
        return _never_connected(state, policy)

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
        return exhausted(state, signal, why)

    per_route = policy.attempts_per_route
    explicit = per_route is not None
    if not explicit and state.index < len(state.chain) - 1:
        per_route = default_attempts_per_route(policy.max_attempts, len(state.chain))
    if per_route is not None and state.route_attempts >= per_route:
        found = next_route(state, policy, exclude_providers=state.spent_providers)
        if isinstance(found, FallBack):
            return _fit_fallback(state, policy, now, found, signal)
        if explicit:
            return exhausted(
                state,
                signal,
                f"every route of the chain was tried ({len(state.chain)} routes)",
                skipped=found,
            )
        # The default bound only moves a call on; with nowhere to go it keeps retrying here.

    minimum = signal.retry_after if signal.retry_after else None
    step = wait_before(state, signal, policy.pause_limit_secs, now, state.route, minimum)
    if not (isinstance(step, Stop) and step.status is Status.WAITING_FOR_CAPACITY):
        return step
    # This route's own wait cannot fit: a healthy fallback may still serve the call now.
    moved = fall_back_now(state, policy, step.reason)
    if isinstance(moved, FallBack):
        return moved
    return Stop(
        step.status, step.reason, retry_at=step.retry_at, retry_in=step.retry_in, skipped=moved
    )


def _never_connected(state: LoopState, policy: LoopSettings) -> FallBack | Stop:
    """Rule 3a: no retry of a connection that never opened to an endpoint never answered."""
    why = (
        f"could not connect to {state.route.scope}, which has not answered in this process "
        "(a wrong base URL, or a server that is not running?); not retried"
    )
    moved = fall_back_now(state, policy, why)
    if isinstance(moved, FallBack):
        return moved
    return Stop(Status.FAILED_RETRY_EXHAUSTED, why, skipped=moved)


def default_attempts_per_route(max_attempts: int, routes: int) -> int:
    """Attempts a route gets before the next when ``attempts_per_route`` is unset.

    :data:`DEFAULT_ATTEMPTS_PER_ROUTE`, but never so many that ``max_attempts``
    runs out before every route of the chain had a turn.  The last route of a
    chain is not bounded by it: there is nowhere left to move on to.

    >>> default_attempts_per_route(20, 2), default_attempts_per_route(6, 3)
    (5, 2)
    """
    return max(1, min(DEFAULT_ATTEMPTS_PER_ROUTE, math.ceil(max_attempts / routes)))


def _fit_fallback(
    state: LoopState, policy: LoopSettings, now: float, found: FallBack, signal: LimitSignal
) -> FallBack | Stop:
    if found.route.tier == "batch":  # nothing is sent now: no backoff before the hand-over
        reason = f"{signal.kind.value} on {state.route.scope}; moving to the batch rung"
        return FallBack(found.route, 0.0, reason, found.index, found.skipped)
    # A server's minimum belongs to the scope that sent it: between routes, the backoff.
    step = wait_before(state, signal, policy.pause_limit_secs, now, found.route, None)
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


# --- rule 8: admission ----------------------------------------------------------------


def book_within(state: LoopState, settings: LoopSettings, now: float) -> float:
    """How far ahead a start may be booked: the time left, the pause limit, the horizon."""
    left = state.budget.time_left(now)
    limit = settings.pause_limit_secs
    afford = limit if left is None else left
    return max(0.0, min(afford, limit, BOOK_HORIZON_SECS))


def decide_admission(
    state: LoopState, refusal: AdmissionRefusal, settings: LoopSettings, now: float
) -> Wait | FallBack | Stop:
    """What to do when admission refused the call on ``state.route`` (rule 8).

    The refusal is already recorded (:func:`~rateloop.timing.state.record_refusal`),
    so the recovery clock runs.  A :class:`Wait` here is an admission wait,
    not a retry: the loop does not :func:`~rateloop.timing.state.take` it.
    """
    step = _decide_admission(state, refusal, settings, now)
    return ladder_end(step, state.ladder) if isinstance(step, Stop) else step


def _decide_admission(
    state: LoopState, refusal: AdmissionRefusal, settings: LoopSettings, now: float
) -> Wait | FallBack | Stop:
    route = state.route
    if refusal.never_fits:
        return Stop(Status.REJECTED, f"admission refused on {route.scope}: {refusal.reason}")
    retry_after = refusal.retry_after
    left = state.budget.time_left(now)
    if retry_after > settings.pause_limit_secs or (left is not None and retry_after >= left):
        why = (
            f"no capacity on {route.scope} before the deadline, the budget "
            f"or the pause limit ({refusal.reason})"
        )
        # Like a server minimum that cannot fit: a fallback may serve now.
        moved = fall_back_now(state, settings, why)
        if isinstance(moved, FallBack):
            return moved
        return Stop(Status.WAITING_FOR_CAPACITY, why, retry_in=retry_after, skipped=moved)
    return Wait(
        retry_after + ARRIVAL_SLACK_SECS, f"waiting for capacity on {refusal.scope}", route
    )


# --- rule 9: writes -------------------------------------------------------------------


def decide_write(state: LoopState, verdict: WriteOutcome | None) -> Stop | None:
    """After a write failed ambiguously: stop, or None for the one controlled retry (rule 9).

    ``verdict`` is what ``outcome_check`` said, None when the call has none.
    The loop records a None answer with
    :func:`~rateloop.timing.state.use_controlled_retry`.
    """
    if verdict is None:
        return Stop(
            Status.NEEDS_OPERATOR,
            "unknown_outcome: the write may have taken effect and there is no outcome_check",
        )
    if verdict is WriteOutcome.APPLIED:
        status = Status.COMPLETED if state.index == 0 else Status.DEGRADED
        return Stop(status, "the write took effect (confirmed by outcome_check)")
    if verdict is WriteOutcome.UNKNOWN:
        return Stop(
            Status.NEEDS_OPERATOR,
            "unknown_outcome: outcome_check could not tell whether the write took effect",
        )
    if state.controlled_retry_used:
        return Stop(
            Status.NEEDS_OPERATOR, "unknown_outcome: the controlled retry failed ambiguously too"
        )
    return None
