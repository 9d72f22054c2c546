"""What a durable engine (Temporal, Celery, DBOS) does with an :class:`Outcome`: one mapping.

Inside an engine, rateloop waits only the short waits (those within the policy's pause limit)
and hands every longer one back to the engine, which holds the timer while the worker slot is
free.  Every engine integration turns an outcome into one :data:`EngineVerdict`:

- :class:`Finish` — ``completed`` or ``degraded`` (``degraded`` is marked: the work was done on
  an approved fallback);
- :class:`RetryLater` — ``waiting_for_reset`` / ``waiting_for_capacity``: run the same work again
  after ``delay_secs`` (the time until the outcome's ``retry_at``), in the engine's retry language
  (Temporal's ``next_retry_delay``, Celery's ``countdown``, a DBOS workflow sleep);
- :class:`GiveUp` — ``needs_operator``, ``invalid``, ``rejected``, ``failed_retry_exhausted``: a
  terminal failure the engine must not retry, with the outcome's reason.

The engine's own attempts count against rateloop's attempt budget (:func:`engine_run_budget`),
so the engine's retry policy and rateloop's budgets never multiply each other.

>>> from datetime import UTC, datetime, timedelta
>>> from rateloop.outcome import Outcome, Status
>>> now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
>>> verdict(Outcome(status=Status.WAITING_FOR_RESET, reason="day quota",
...                 retry_at=now + timedelta(minutes=5)), now=now)
RetryLater(delay_secs=300.0, reason='day quota', status='waiting_for_reset')
>>> verdict(Outcome(status=Status.INVALID, reason="bad request"), now=now)
GiveUp(status='invalid', reason='bad request')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, assert_never

from rateloop.outcome.record import Outcome, Status
from rateloop.policy import Policy
from rateloop.timing.budget import RunBudget

__all__ = ["EngineVerdict", "Finish", "GiveUp", "RetryLater", "engine_run_budget", "verdict"]

#: The shortest delay handed to an engine: a reset already due is retried soon, not at once
#: (Temporal refuses a zero ``next_retry_delay``; a zero Celery countdown is a busy loop).
MIN_ENGINE_DELAY_SECS = 1.0


@dataclass(frozen=True, slots=True)
class Finish:
    """The work was done: ``value``; ``degraded`` when it finished on an approved fallback."""

    value: Any
    degraded: bool
    outcome: Outcome = field(repr=False)


@dataclass(frozen=True, slots=True)
class RetryLater:
    """Run the same work again in ``delay_secs``; the engine holds the wait, not the worker."""

    delay_secs: float
    reason: str
    status: str
    outcome: Outcome = field(repr=False)


@dataclass(frozen=True, slots=True)
class GiveUp:
    """A terminal failure: the engine must not retry it.  ``status`` is the outcome's."""

    status: str
    reason: str
    outcome: Outcome = field(repr=False)

    @property
    def error(self) -> BaseException | None:
        """The original exception of the last attempt, kept for the engine's failure chain."""
        return self.outcome.error


EngineVerdict = Finish | RetryLater | GiveUp


def verdict(
    outcome: Outcome, *, now: datetime, min_delay_secs: float = MIN_ENGINE_DELAY_SECS
) -> EngineVerdict:
    """Map ``outcome`` to what the engine does next; ``now`` is an aware datetime."""
    status = outcome.status
    match status:
        case Status.COMPLETED | Status.DEGRADED:
            return Finish(outcome.value, status is Status.DEGRADED, outcome)
        case Status.WAITING_FOR_RESET | Status.WAITING_FOR_CAPACITY:
            delay = min_delay_secs
            if outcome.retry_at is not None:
                delay = max(min_delay_secs, (outcome.retry_at - now).total_seconds())
            return RetryLater(delay, outcome.reason, status.value, outcome)
        case (
            Status.NEEDS_OPERATOR
            | Status.INVALID
            | Status.REJECTED
            | Status.FAILED_RETRY_EXHAUSTED
        ):
            return GiveUp(status.value, outcome.reason, outcome)
        case _:
            assert_never(status)


def engine_run_budget(policy: Policy, *, prior_attempts: int) -> RunBudget:
    """The attempt budget of one engine attempt: the policy's, less what earlier ones spent.

    ``prior_attempts`` is what the engine's earlier attempts of this work made: at least one per
    earlier engine attempt (Temporal's ``activity.info().attempt - 1``, Celery's
    ``request.retries``), or the provider requests they really made when the engine carries that
    count between attempts.  When it reaches ``policy.max_attempts`` the loop makes no attempt and
    ends ``failed_retry_exhausted``: a :class:`GiveUp`.

    >>> from rateloop import Policy
    >>> engine_run_budget(Policy.from_dict({"max_attempts": 4}), prior_attempts=3)
    RunBudget(used=3, max_attempts=4)
    """
    if isinstance(prior_attempts, bool) or not isinstance(prior_attempts, int) or (
        prior_attempts < 0
    ):
        raise ValueError(f"prior_attempts must be an int >= 0, got {prior_attempts!r}")
    budget = RunBudget(policy.max_attempts)
    budget.charge(prior_attempts)
    return budget
