"""How the decider ends a call: the terminal :class:`~rateloop.timing.decision.Stop` for a signal.

Rule 1 (``ok``), rules 2 and 3 (signals never retried) and the exhausted
budget of rule 4 of :mod:`rateloop.timing.decide` end here, each with a
reason a person can act on.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rateloop.outcome.record import Status
from rateloop.signal import Kind, LimitSignal
from rateloop.timing.decision import Skips, Stop
from rateloop.timing.state import LoopState

__all__ = ["completed", "exhausted", "stop_for"]

# How the outcome of a degraded call names what happened to the primary.
_LIMITED_AS: dict[Kind | None, str] = {
    Kind.TEMPORARY: "was rate-limited",
    Kind.OVERLOAD: "was overloaded",
    Kind.PERIOD_QUOTA: "ran out of its period quota",
    Kind.SPEND: "hit a spend limit",
    Kind.SERVER_ERROR: "failed with a server error",
    Kind.NETWORK: "was unreachable",
}


def completed(state: LoopState) -> Stop:
    """Rule 1: ``completed`` on the primary, ``degraded`` (naming what the primary did) after."""
    route = state.route
    if state.index == 0:
        return Stop(Status.COMPLETED, f"completed on {route.scope}")
    limited = state.limited_route or state.chain[0]
    what = _LIMITED_AS.get(state.limited_kind, "was refused")
    return Stop(
        Status.DEGRADED,
        f"Primary model {limited.model} {what} — completed with {route.model}",
    )


def exhausted(state: LoopState, signal: LimitSignal, why: str, *, skipped: Skips = ()) -> Stop:
    return Stop(
        Status.FAILED_RETRY_EXHAUSTED,
        f"{signal.kind.value} persisted on {state.route.scope}: {why}",
        skipped=skipped,
    )


def stop_for(state: LoopState, signal: LimitSignal, now: float, *, skipped: Skips = ()) -> Stop:
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
