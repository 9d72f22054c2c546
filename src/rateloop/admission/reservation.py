"""The results of admission: a :class:`Reservation` to settle, or a :class:`Denied`.

::

    RateloopError
    ├── AdmissionTimeout    reserve() would have to wait past its deadline
    └── AdmissionRejected   reserve() of a cost larger than a limit itself

Settling: a reservation holds the *estimated* cost (input tokens and the max
output tokens).  :meth:`Reservation.settle` with the actual usage settles as
the provider's accounting profile says (:mod:`rateloop.admission.profile`):
input is corrected to the usage; unused output is refunded where the provider
corrects it (Anthropic, Bedrock, Azure, generic) and kept where it keeps
``max_tokens`` (OpenAI).  Usage above the estimate is charged:
the bucket's level may then exceed its capacity (a debt), and later calls
wait until it has drained.  :meth:`Reservation.release` is for a call that
was rejected: every token goes back, the request itself stays counted
(providers count a rejected request).  Both release the concurrency lease,
and both are idempotent.

A reservation calls back into whoever granted it through :class:`Settler`,
the few public names it uses (the limiter's
:class:`~rateloop.admission.admit.Admissions` implements it); this module
never imports the limiter.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol

from rateloop.admission.gcra import AIMD
from rateloop.admission.plan import AdmitPlan, Check, SettleOp
from rateloop.admission.profile import usage_charge
from rateloop.errors import RateloopError
from rateloop.outcome.record import Status
from rateloop.route import Cost, Priority, Route
from rateloop.signal import Dimension

__all__ = [
    "AdmissionRejected",
    "AdmissionTimeout",
    "Denied",
    "Reservation",
    "Settler",
    "denial_reason",
]


def denial_reason(dimension: Dimension | None, paused_reason: str | None = None) -> str:
    """A denial's reason in words: the pause in force, or the limit its dimension reached."""
    if paused_reason is not None:
        return f"scope paused: {paused_reason}"
    return f"{dimension.value if dimension else 'capacity'} limit reached"


class Settler(Protocol):
    """What a :class:`Reservation` calls back into: the limiter side that granted it."""

    @property
    def aimd(self) -> AIMD:
        """The AIMD settings a settle applies (its recovery rate)."""
        ...

    def refused_before(self, scopes: tuple[str, ...], start: float, local: bool) -> bool:
        """Did a refusal known in one of ``scopes`` leave nothing at the backend time ``start``?"""
        ...

    def settle(self, op: SettleOp, *, local: bool) -> float | None:
        """Run ``op`` on the backend that granted (``local``: the local fallback); its time."""
        ...

    async def asettle(self, op: SettleOp, *, local: bool) -> float | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Denied:
    """A call that does not fit now.  Falsy, so ``if limiter.try_reserve(...)`` reads well.

    ``retry_after`` is the seconds until it would fit (finite; for a paused
    scope the pause's end plus a small spread).  ``never_fits`` means the
    cost exceeds a limit itself (e.g. more input tokens than the TPM burst):
    waiting cannot help and ``retry_after`` is meaningless.
    """

    retry_after: float
    scope: str
    dimension: Dimension | None
    reason: str
    never_fits: bool = False

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        dim = self.dimension.value if self.dimension is not None else None
        extra = ", never_fits" if self.never_fits else ""
        return (
            f"Denied(retry_after={self.retry_after:.3f}s, scope={self.scope!r}, "
            f"dimension={dim!r}, reason={self.reason!r}{extra})"
        )


class AdmissionTimeout(RateloopError):
    """``reserve()`` would have had to wait past its deadline, so it did not wait."""

    status = Status.WAITING_FOR_CAPACITY

    def __init__(self, denied: Denied, *, retry_after: float, retry_at: datetime) -> None:
        self.denied = denied
        self.retry_after = retry_after
        self.retry_at = retry_at
        super().__init__(
            f"no capacity before the deadline in {denied.scope!r} ({denied.reason}); "
            f"it would fit in {retry_after:.3f}s, at {retry_at.isoformat()}"
        )


class AdmissionRejected(RateloopError):
    """``reserve()`` of a cost that can never fit (larger than the limit itself)."""

    status = Status.REJECTED

    def __init__(self, denied: Denied) -> None:
        self.denied = denied
        super().__init__(f"cost can never be admitted in {denied.scope!r}: {denied.reason}")


#: Guards ``_done`` of every reservation: a claim is a few instructions, so one lock
#: for all is cheaper than a lock per reservation.
_CLAIM_LOCK = threading.Lock()

_new_tuple = tuple.__new__


class Reservation:
    """A granted claim on capacity in every scope of ``route``.

    ``granted_at`` and ``settled_at`` are the backend's times (Redis ``TIME``
    in seconds since the epoch; the clock's monotonic seconds in memory);
    ``settled_at`` stays None when settling needed no backend call.
    ``starts_in`` is 0 for a call that may go now; for a *booked* one
    (``try_reserve(..., book_within=...)``) the seconds after ``granted_at``
    it must wait before calling -- its capacity is charged already.

    Use it from sync or async code (``settle``/``asettle``,
    ``release``/``arelease``), or as a (async) context manager: leaving the
    block normally settles at the estimate, leaving it by an exception
    releases.
    """

    __slots__ = (
        "_done",
        "_owner",
        "cost",
        "granted_at",
        "lease_id",
        "local",
        "plan",
        "route",
        "settled_at",
        "starts_in",
    )

    def __init__(
        self,
        owner: Settler,
        route: Route,
        cost: Cost,
        plan: AdmitPlan,
        lease_id: str | None,
        granted_at: float,
        local: bool,
        starts_in: float = 0.0,
    ) -> None:
        """Built by the limiter once per admission (positional: it is hot).

        ``plan`` is the one that ran (scaled to the local share when ``local``),
        so a settle adjusts exactly the buckets that were charged.
        """
        self._owner = owner
        self.route = route
        self.cost = cost
        self.plan = plan
        self.granted_at = granted_at
        self.local = local
        self.lease_id = lease_id if plan.lease_scopes else None
        self.settled_at: float | None = None
        self.starts_in = starts_in
        self._done = False

    @property
    def priority(self) -> Priority:
        return self.plan.priority

    @property
    def checks(self) -> tuple[Check, ...]:
        """The checks this reservation passed (amounts: ``plan.amounts(cost)``)."""
        return self.plan.checks

    @property
    def lease_scope(self) -> str | None:
        """The first of :attr:`lease_scopes`, or None when the call holds no lease."""
        return self.plan.lease_scope

    @property
    def lease_scopes(self) -> tuple[str, ...]:
        """Every scope with a concurrency limit: the lease is held (and released) in each."""
        return self.plan.lease_scopes

    @property
    def stale(self) -> bool:
        """A *booked* start that a refusal since made void: do not send it, admit again.

        The provider refused a call meanwhile (another client of the key took
        capacity, say) and said it has nothing before a time -- the pause it
        asked for, or the reset of a bucket it reported empty -- later than this
        reservation's start.  Sent, the call would be refused and would spend a
        slot at the provider, pushing the deficit on to the next booked start;
        given back (``release``) and admitted again, it waits out the refusal
        and books behind the schedule, while the bookings after that time keep
        their starts.  The check reads only what this process
        knows (no round trip): its own refusals, and other processes' as the
        shared backend reported them with this process's admissions and settles.
        """
        if self.starts_in <= 0.0:
            return False
        start = self.granted_at + self.starts_in
        return self._owner.refused_before(self.plan.scopes, start, self.local)

    @property
    def done(self) -> bool:
        """True once settled or released."""
        return self._done

    def __repr__(self) -> str:
        state = "done" if self._done else "open"
        where = ", local" if self.local else ""
        return (
            f"Reservation({self.route.scope!r}, {self.cost!r}, {self.priority.value}, "
            f"{state}{where})"
        )

    # -- building the settle operation (pure) -----------------------------------

    def _settle_op(self, input_tokens: int, output_tokens: int) -> SettleOp | None:
        # ``type(x) is int`` first: the common case, without two isinstance calls.
        if not (type(input_tokens) is int or _is_count(input_tokens)) or input_tokens < 0:
            _bad_usage("input_tokens", input_tokens)
        if not (type(output_tokens) is int or _is_count(output_tokens)) or output_tokens < 0:
            _bad_usage("output_tokens", output_tokens)
        cost = self.cost
        return self._op(
            self.plan.profile.settle_deltas(
                (cost.input_tokens, cost.output_tokens), (input_tokens, output_tokens)
            )
        )

    def _release_op(self) -> SettleOp | None:
        cost = self.cost
        return self._op((-cost.input_tokens, -cost.output_tokens, -cost.tokens))

    def _op(self, deltas: tuple[int, int, int]) -> SettleOp | None:
        """The settle operation: ``deltas`` are (input, output, total) tokens to add."""
        checks: list[Check] = []
        values: list[float] = []
        for check, index in self.plan.refunds:
            delta = deltas[index]
            if delta:
                checks.append(check)
                values.append(float(delta))
        if not checks and self.lease_id is None:
            return None
        return _new_tuple(
            SettleOp,
            (
                self.plan,
                tuple(checks),
                tuple(values),
                self.lease_id,
                self._owner.aimd,
                self.granted_at + self.starts_in,
            ),
        )

    def claim_release(self) -> SettleOp | None:
        """Mark this reservation released; the operation that gives it back, for the caller to run.

        For the limiter's flows, which run the operation as one of their steps
        (a booked start that a refusal voided, :attr:`stale`).  None: it was
        done already, or there is nothing to give back.
        """
        op = self._release_op()
        return op if self._claim() else None

    def _claim(self) -> bool:
        _CLAIM_LOCK.acquire()  # not ``with``: half the cost, same guarantee
        try:
            if self._done:
                return False
            self._done = True
            return True
        finally:
            _CLAIM_LOCK.release()

    def _unclaim(self) -> None:
        with _CLAIM_LOCK:
            self._done = False

    # -- the public twins ---------------------------------------------------------

    def settle(self, input_tokens: int, output_tokens: int) -> None:
        """Settle against the actual usage; a second call does nothing."""
        op = self._settle_op(input_tokens, output_tokens)
        self._finish(op)

    async def asettle(self, input_tokens: int, output_tokens: int) -> None:
        op = self._settle_op(input_tokens, output_tokens)
        await self._afinish(op)

    def settle_usage(self, usage: Any) -> None:
        """Settle against a provider's usage object (or its JSON), read as its profile says.

        ``usage`` is e.g. ``response.usage`` of the OpenAI or Anthropic SDK,
        ``usage_metadata`` of google-genai, or Bedrock's ``usage``; cache
        reads are left out where the provider does not count them
        (:func:`rateloop.admission.profile.usage_charge`).
        """
        self.settle(*usage_charge(self.plan.profile, usage))

    async def asettle_usage(self, usage: Any) -> None:
        await self.asettle(*usage_charge(self.plan.profile, usage))

    def release(self) -> None:
        """Give back every token (the request stays counted); a second call does nothing."""
        self._finish(self._release_op())

    async def arelease(self) -> None:
        await self._afinish(self._release_op())

    def _finish(self, op: SettleOp | None) -> None:
        if not self._claim():
            return
        if op is None:
            return
        try:
            self.settled_at = self._owner.settle(op, local=self.local)
        except BaseException:
            self._unclaim()
            raise

    async def _afinish(self, op: SettleOp | None) -> None:
        if not self._claim():
            return
        if op is None:
            return
        try:
            self.settled_at = await self._owner.asettle(op, local=self.local)
        except BaseException:
            self._unclaim()
            raise

    # -- context managers -----------------------------------------------------------

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.release()
        else:
            self.settle(self.cost.input_tokens, self.cost.output_tokens)

    async def __aenter__(self) -> Reservation:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            await self.arelease()
        else:
            await self.asettle(self.cost.input_tokens, self.cost.output_tokens)


def _bad_usage(name: str, value: object) -> None:
    raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
