"""The wait before the next attempt, or why there is none (rules 5-7 of the decider).

:func:`wait_before` plans one wait with :func:`~rateloop.timing.backoff.plan_wait`
and holds it to the pause limit, the loop's own budgets and the caller's
deadline; see :mod:`rateloop.timing.decide` for the rules in order.
"""

from __future__ import annotations

from datetime import datetime

from rateloop.outcome.record import Status
from rateloop.route import Route
from rateloop.signal import LimitSignal
from rateloop.timing.backoff import plan_wait
from rateloop.timing.budget import CallBudget
from rateloop.timing.decision import Stop, Wait
from rateloop.timing.exits import exhausted
from rateloop.timing.state import LoopState

__all__ = ["own_budget_left", "wait_before"]


def wait_before(
    state: LoopState,
    signal: LimitSignal,
    pause_limit: float,
    now: float,
    route: Route,
    minimum: float | None,
) -> Wait | Stop:
    """The wait before the next attempt on ``route``, or why there is none.

    Rules 5-7 of the decider: a server minimum that does not fit stops;
    our own backoff is capped at the pause limit and the budget left; the
    jitter is clamped to end before the deadline when the floor fits.
    """
    own_left = own_budget_left(state.budget, now)
    limit = pause_limit
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
        return exhausted(state, signal, "the time budget is spent")
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


def own_budget_left(budget: CallBudget, now: float) -> float | None:
    """Seconds left in the loop's own time budgets (not the caller's deadline)."""
    bounds: list[float] = []
    if budget.first_refusal_at is not None:
        bounds.append(budget.recovery_budget_secs - (now - budget.first_refusal_at))
    if budget.max_wait_secs is not None:
        bounds.append(budget.max_wait_secs - (now - budget.started_at))
    return min(bounds) if bounds else None


def _later(a: datetime | None, b: datetime) -> datetime:
    return b if a is None or a < b else a
