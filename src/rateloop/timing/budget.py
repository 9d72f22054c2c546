"""Budgets: how many attempts and how much waiting one call, and one run, may spend.

Two budgets bound every retry loop:

* :class:`CallBudget` — one call's attempts (the first attempt counts) and
  its recovery time.  Attempts are counted as the provider sees them: the
  loop's own attempts plus the retries an SDK took inside them
  (:meth:`CallBudget.record_sdk_retries`), so a client that keeps its own
  retries on cannot multiply the budget.  The recovery clock starts at the FIRST refusal, not at
  the start of the call: a call that worked for ten minutes and is then
  throttled still gets its whole recovery budget.  Time spent inside later
  attempts counts against it too, so the budget bounds the wall time from
  the first refusal to giving up.  Optional ``deadline`` and
  ``max_wait_secs`` (measured from ``started_at``) bound it further.
  With ``max_error_attempts`` set, attempts that ended in a network error,
  a 5xx or an overload (:data:`ERROR_KINDS`) are counted apart, against
  their own bound, and ``max_attempts`` bounds the rest (429s and
  everything else): a burst of 503s cannot eat the 429 budget, and
  ``max_attempts=1`` turns off 429 retries alone.  Unset, one count covers
  every attempt (the plain loop's default).
* :class:`RunBudget` — the attempts of every call of one task together.  A
  per-step counter reset after each success would otherwise allow unbounded
  attempts over a long run; each :meth:`CallBudget.record_attempt` also
  spends from the shared run budget, and is refused when it is empty.

Both are sans-IO: every time is a monotonic reading passed in by the driver.

The attempt ledger, which counts attempts by layer (rateloop's loop, retries
inside an SDK, queue redeliveries), lives in :mod:`rateloop.outcome` as
:class:`~rateloop.outcome.AttemptLedger` (running, thread-safe) and
:class:`~rateloop.outcome.Attempts` (a frozen snapshot with
``provider_requests``); it is re-exported here for convenience.
"""

from __future__ import annotations

import math
import threading

from rateloop.outcome.record import AttemptLedger, Attempts
from rateloop.signal import Kind

__all__ = ["ERROR_KINDS", "AttemptLedger", "Attempts", "CallBudget", "RunBudget"]

#: Refusals counted against ``max_error_attempts`` when it is set: network
#: errors, 5xx and overloads (everything else counts against ``max_attempts``).
ERROR_KINDS: frozenset[Kind] = frozenset({Kind.NETWORK, Kind.SERVER_ERROR, Kind.OVERLOAD})


def _positive_int(owner: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner} {name} must be an int >= 1, got {value!r}")
    return value


def _seconds(owner: str, name: str, value: object) -> float:
    if type(value) is float and not math.isnan(value):  # a clock's reading: the fast path
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{owner} {name} must be a number of seconds, got {value!r}")
    return float(value)


def _optional_seconds(owner: str, name: str, value: object) -> float | None:
    return None if value is None else _seconds(owner, name, value)


class RunBudget:
    """Attempts shared by all calls of one task; safe to share between threads.

    >>> run = RunBudget(3)
    >>> [run.try_spend() for _ in range(4)]
    [True, True, True, False]
    >>> run.used, run.remaining
    (3, 0)
    """

    __slots__ = ("_lock", "_used", "max_attempts")

    def __init__(self, max_attempts: int) -> None:
        self.max_attempts = _positive_int("RunBudget", "max_attempts", max_attempts)
        self._used = 0
        self._lock = threading.Lock()

    def charge(self, n: int) -> None:
        """Record ``n`` attempts already made (retries inside an SDK): never refused.

        The count may pass ``max_attempts``; the budget is then exhausted.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"RunBudget.charge n must be an int >= 0, got {n!r}")
        with self._lock:
            self._used += n

    def try_spend(self, n: int = 1) -> bool:
        """Spend ``n`` attempts, all or none; False when fewer than ``n`` remain."""
        _positive_int("RunBudget.try_spend", "n", n)
        with self._lock:
            if self._used + n > self.max_attempts:
                return False
            self._used += n
            return True

    @property
    def used(self) -> int:
        return self._used

    @property
    def remaining(self) -> int:
        return max(self.max_attempts - self._used, 0)

    @property
    def exhausted(self) -> bool:
        return self._used >= self.max_attempts

    def __repr__(self) -> str:
        return f"RunBudget(used={self._used}, max_attempts={self.max_attempts})"


class CallBudget:
    """The attempt and time budget of one call (sans-IO: pass the time in).

    Not meant to be shared between threads: one call is driven by one loop.
    Share a :class:`RunBudget` instead.
    """

    __slots__ = (
        "_attempts",
        "_error_attempts",
        "_first_refusal_at",
        "deadline",
        "max_attempts",
        "max_error_attempts",
        "max_wait_secs",
        "recovery_budget_secs",
        "run",
        "started_at",
    )

    def __init__(
        self,
        *,
        max_attempts: int,
        recovery_budget_secs: float,
        started_at: float,
        deadline: float | None = None,
        max_wait_secs: float | None = None,
        run: RunBudget | None = None,
        max_error_attempts: int | None = None,
    ) -> None:
        self.max_attempts = _positive_int("CallBudget", "max_attempts", max_attempts)
        self.max_error_attempts = (
            None
            if max_error_attempts is None
            else _positive_int("CallBudget", "max_error_attempts", max_error_attempts)
        )
        recovery = _seconds("CallBudget", "recovery_budget_secs", recovery_budget_secs)
        if recovery < 0:
            raise ValueError(f"CallBudget recovery_budget_secs must be >= 0, got {recovery!r}")
        self.recovery_budget_secs = recovery
        self.started_at = _seconds("CallBudget", "started_at", started_at)
        self.deadline = _optional_seconds("CallBudget", "deadline", deadline)
        self.max_wait_secs = _optional_seconds("CallBudget", "max_wait_secs", max_wait_secs)
        if run is not None and not isinstance(run, RunBudget):
            raise ValueError(f"CallBudget run must be a RunBudget or None, got {run!r}")
        self.run = run
        self._attempts = 0
        self._error_attempts = 0
        self._first_refusal_at: float | None = None

    def fresh(self, *, started_at: float, deadline: float | None = None) -> CallBudget:
        """A new, unspent budget with this one's bounds and run, started at ``started_at``.

        The bounds were checked when this budget was built and are not checked
        again (a loop builds one template per policy and a fresh budget per call).

        >>> template = CallBudget(max_attempts=3, recovery_budget_secs=60, started_at=0)
        >>> budget = template.fresh(started_at=5.0, deadline=65.0)
        >>> budget.max_attempts, budget.started_at, budget.deadline, budget.attempts
        (3, 5.0, 65.0, 0)
        """
        new = CallBudget.__new__(CallBudget)
        new.max_attempts = self.max_attempts
        new.max_error_attempts = self.max_error_attempts
        new.recovery_budget_secs = self.recovery_budget_secs
        new.max_wait_secs = self.max_wait_secs
        new.run = self.run
        new.started_at = _seconds("CallBudget", "started_at", started_at)
        new.deadline = _optional_seconds("CallBudget", "deadline", deadline)
        new._attempts = 0
        new._error_attempts = 0
        new._first_refusal_at = None
        return new

    # -- attempts --------------------------------------------------------

    @property
    def attempts(self) -> int:
        """Attempts recorded by this call, the first one included, SDK retries too."""
        return self._attempts

    @property
    def error_attempts(self) -> int:
        """Attempts that ended in one of :data:`ERROR_KINDS` (network, 5xx, overload)."""
        return self._error_attempts

    @property
    def separate(self) -> bool:
        """True when errors have their own bound (``max_error_attempts`` is set)."""
        return self.max_error_attempts is not None

    def _counted(self) -> int:
        """The attempts ``max_attempts`` bounds: all of them, or all but the errors."""
        return self._attempts - self._error_attempts if self.separate else self._attempts

    def can_attempt(self) -> bool:
        """True when this call and its run both have an attempt left."""
        if self._counted() >= self.max_attempts:
            return False
        return self.run is None or not self.run.exhausted

    def can_retry(self, kind: Kind) -> bool:
        """True when a refusal of ``kind`` (already recorded) may be retried.

        With separate bounds an error kind is bounded by
        ``max_error_attempts`` alone, and every other kind by ``max_attempts``
        alone; the run budget bounds both.
        """
        if self.max_error_attempts is not None and kind in ERROR_KINDS:
            if self._error_attempts >= self.max_error_attempts:
                return False
            return self.run is None or not self.run.exhausted
        return self.can_attempt()

    def bound_of(self, kind: Kind) -> str:
        """The name of the bound a refusal of ``kind`` counts against (for messages)."""
        if self.max_error_attempts is not None and kind in ERROR_KINDS:
            return "max_error_attempts"
        return "max_attempts"

    def record_attempt(self) -> bool:
        """Count one attempt, spending it from the run budget; False if refused."""
        if self._counted() >= self.max_attempts:
            return False
        if self.run is not None and not self.run.try_spend():
            return False
        self._attempts += 1
        return True

    def record_sdk_retries(self, retries: int) -> None:
        """Count retries an SDK took inside the last attempt: they reached the provider.

        They are not refused (they already happened); they spend from the
        run budget too, and may leave this call with no attempt left.
        """
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"SDK retries must be an int >= 0, got {retries!r}")
        if retries:
            self._attempts += retries
            if self.run is not None:
                self.run.charge(retries)

    # -- time ------------------------------------------------------------

    @property
    def first_refusal_at(self) -> float | None:
        """When the recovery clock started (None until the first refusal)."""
        return self._first_refusal_at

    def record_refusal(self, now: float, kind: Kind | None = None) -> None:
        """Note a refusal; the first one starts the recovery clock.

        ``kind`` is what the last attempt ended in: one of :data:`ERROR_KINDS`
        moves that attempt to the error count.  None (admission found no
        capacity: nothing was sent) counts no attempt.
        """
        if self._first_refusal_at is None:
            self._first_refusal_at = _seconds("CallBudget", "now", now)
        if kind in ERROR_KINDS and self._error_attempts < self._attempts:
            self._error_attempts += 1

    def time_left(self, now: float) -> float | None:
        """Seconds left before a bound is reached (may be negative); None if unbounded."""
        bounds: list[float] = []
        if self._first_refusal_at is not None:
            bounds.append(self.recovery_budget_secs - (now - self._first_refusal_at))
        if self.deadline is not None:
            bounds.append(self.deadline - now)
        if self.max_wait_secs is not None:
            bounds.append(self.max_wait_secs - (now - self.started_at))
        return min(bounds) if bounds else None

    def fits(self, now: float, wait: float) -> bool:
        """True when waiting ``wait`` seconds from ``now`` stays within every bound."""
        left = self.time_left(now)
        return left is None or wait <= left

    def reset_step(self) -> None:
        """Start a new step after a success: own attempts and recovery clock restart.

        The run budget is not refunded, so resetting after every success
        never allows more attempts than the run budget.
        """
        self._attempts = 0
        self._error_attempts = 0
        self._first_refusal_at = None

    def __repr__(self) -> str:
        parts = [f"attempts={self._attempts}/{self.max_attempts}"]
        if self.max_error_attempts is not None:
            parts.append(f"error_attempts={self._error_attempts}/{self.max_error_attempts}")
        parts.append(f"recovery_budget_secs={self.recovery_budget_secs:g}")
        if self._first_refusal_at is not None:
            parts.append(f"first_refusal_at={self._first_refusal_at:g}")
        if self.deadline is not None:
            parts.append(f"deadline={self.deadline:g}")
        if self.max_wait_secs is not None:
            parts.append(f"max_wait_secs={self.max_wait_secs:g}")
        if self.run is not None:
            parts.append(repr(self.run))
        return f"CallBudget({', '.join(parts)})"
