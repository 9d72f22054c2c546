"""Admission: the flows behind ``try_reserve`` and ``reserve``, and what a reservation calls back.

How it works.  An admission is two halves around one backend step:
:meth:`Admissions.admit_op` builds the operation from the cached plan
(:class:`~rateloop.admission.known.KnownLimits`) -- or a denial needing no
round trip -- and :meth:`Admissions.admit_outcome` reads the backend's answer
into a :class:`~rateloop.admission.reservation.Reservation` or a
:class:`~rateloop.admission.reservation.Denied`.  :meth:`Admissions.admit_flow`
puts them in a flow (refreshing what other processes learned first, on a
shared backend); :meth:`Admissions.reserve_flow` repeats it, books a start
rather than polls, sleeps until the turn, gives back a booking a refusal
voided, and gives up at the deadline.  The flows yield steps that the
:class:`~rateloop.admission.runner.BackendRunner` performs.

:class:`Admissions` is also what each reservation calls back into (its
:class:`~rateloop.admission.reservation.Settler`): it settles on the backend
that granted, and tells whether a refusal voided a booked start.

Depends on: KnownLimits, BackendRunner (and its Refusals), Reservation --
never on the limiter.
"""

from __future__ import annotations

import itertools
import random
import secrets
from datetime import timedelta

from rateloop.admission.gcra import AIMD, pause_spread
from rateloop.admission.known import KnownLimits
from rateloop.admission.learning import LearnedOp
from rateloop.admission.lease import Leases
from rateloop.admission.plan import AdmitOp, AdmitPlan, AdmitResult, Check, ReturnOp, SettleOp
from rateloop.admission.renewal import Renewal, Renewals
from rateloop.admission.reservation import (
    AdmissionRejected,
    AdmissionTimeout,
    Denied,
    Reservation,
    denial_reason,
)
from rateloop.admission.runner import BackendRunner, Do, Done, Flow, Sleep
from rateloop.admission.steps import Spawn
from rateloop.route import Cost, Priority, Route
from rateloop.signal import clamp_wait

__all__ = ["MAX_BOOK_SECONDS", "MIN_RETRY_AFTER", "Admissions", "booked"]

#: A denial's ``retry_after`` is at least this long (seconds).
MIN_RETRY_AFTER = 0.001
#: The furthest ahead a start is booked (``reserve`` without a deadline books up to this).
MAX_BOOK_SECONDS = 3600.0

_new_tuple = tuple.__new__


class Admissions:
    """Builds admissions from the known plans, reads their answers, settles reservations."""

    def __init__(
        self,
        known: KnownLimits,
        runner: BackendRunner,
        *,
        rng: random.Random,
        aimd: AIMD,
        lease_secs: float | None = None,
    ) -> None:
        self._known = known
        self._runner = runner
        self._refusals = runner.refusals
        self._clock = runner.clock
        self._rng = rng
        self.aimd = aimd
        # Lease ids: unique across processes (random prefix), cheap within one.
        self._lease_prefix = secrets.token_hex(6) + "-"
        self._lease_counter = itertools.count()
        # Local leases (``lease.py``): capacity borrowed in slices, granted in the process.
        self.leases = (
            None
            if lease_secs is None
            else Leases(lease_secs, clock=runner.clock, refusals=runner.refusals, settler=self)
        )
        self._renewals = None if self.leases is None else Renewals(self.leases)

    # -- what a reservation calls back (the Settler protocol) ---------------------------

    def refused_before(self, scopes: tuple[str, ...], start: float, local: bool) -> bool:
        """Did a refusal in one of ``scopes`` leave nothing at the backend time ``start``?"""
        return self._refusals.before(scopes, start, local)

    def settle(self, op: SettleOp, *, local: bool) -> float | None:
        """Settle on the backend that granted; the backend's time (None: dropped)."""
        self._answered(op)
        return self._runner.settle(op, local=local)

    async def asettle(self, op: SettleOp, *, local: bool) -> float | None:
        self._answered(op)
        return await self._runner.asettle(op, local=local)

    def _answered(self, op: SettleOp) -> None:
        """A call admitted in its route's cold start ends with this settle: so does the
        cold start (``known.py``)."""
        if op.plan.cold_scope is not None:
            self._known.answered(op.plan.cold_scope)

    # -- the flows: the algorithm, written once ---------------------------------------------

    def refresh_op(self, route: Route, priority: str | Priority) -> LearnedOp | None:
        """On a shared backend: the read of what other processes learned, when due."""
        if not self._known.shared:
            return None
        return self._known.refresh_op(route, priority, self._clock.monotonic())

    def adopt(self, done: Done) -> None:
        """Take what other processes learned (what running :meth:`refresh_op` returned)."""
        self._known.adopt(done[0])

    def admit_op(self, route: Route, cost: Cost, priority: str | Priority) -> AdmitOp | Denied:
        """First half of an admission: the operation to run, or a denial needing none.

        The plan (cached per route and priority) gives the checks; only the
        amounts and allowances are computed from ``cost``, and not even those
        when the cost is the previous call's (``plan.last``, which also keeps
        the whole operation when no lease id makes each one unique).
        """
        plan = self._known.plan(route, priority)
        if plan.cold_scope is not None and self._known.cold_expired(
            plan.cold_scope, self._clock.monotonic()
        ):
            plan = self._known.plan(route, priority)  # the cold start just ended
        last = plan.last
        if last[0] is cost:
            _, amounts, allowed, op = last
            if op is not None:
                return op
        else:
            # plan.amounts(cost) and plan.allowances(amounts), inlined: the hot path.
            r, i, o = cost.requests, cost.input_tokens, cost.output_tokens
            # Floats: the backends' arithmetic mixes them with float levels, and
            # float-with-float is CPython's fast path.
            amounts = plan.pick((float(r), float(i), float(o), float(i + o), 1.0))
            fit = plan.fit_shares
            if r <= fit[0] and i <= fit[1] and o <= fit[2] and i + o <= fit[3]:
                allowed = plan.shares  # every amount within its class's share
            else:
                never = plan.never_fits(amounts)
                if never is not None:  # no state can change this: no round trip
                    return self._never_fits(plan.checks[never], amounts[never])
                allowed = plan.allowances(amounts)
            if plan.lease_scope is None:
                op = _new_tuple(AdmitOp, (plan, amounts, allowed, None, self.aimd, 0.0))
                plan.last = (cost, amounts, allowed, op)
                return op
            plan.last = (cost, amounts, allowed, None)
        lease_id = f"{self._lease_prefix}{next(self._lease_counter)}"
        return _new_tuple(AdmitOp, (plan, amounts, allowed, lease_id, self.aimd, 0.0))

    def admit_outcome(self, route: Route, cost: Cost, done: Done) -> Reservation | Denied:
        """Second half: interpret the backend's answer (an AdmitResult for the AdmitOp run)."""
        result: AdmitResult = done[0]
        ran: AdmitOp = done[1]
        if result.refused or result.starts_in > 0.0:
            self._heard(result, ran.plan, done[2])
        if result.granted:
            return Reservation(
                self, route, cost, ran.plan, ran.lease_id, result.now, done[2], result.starts_in
            )
        if result.never_fits:  # the local share can be smaller than a cost
            i = next(
                i
                for i, c in enumerate(ran.plan.checks)
                if c.scope == result.scope and c.dimension == result.dimension
            )
            return self._never_fits(ran.plan.checks[i], ran.amounts[i])
        return self._denied(result)

    def admit_flow(
        self,
        route: Route,
        cost: Cost,
        priority: str | Priority,
        deadline: float | None = None,
        book: float = 0.0,
    ) -> Flow[Reservation | Denied]:
        if (refresh := self.refresh_op(route, priority)) is not None:
            self.adopt((yield Do(refresh, deadline=deadline)))
        op = self.admit_op(route, cost, priority)
        if isinstance(op, Denied):
            return op
        if self.leases is not None:
            return (yield from self.lease_flow(route, cost, booked(op, book), deadline))
        done = yield Do(booked(op, book), deadline=deadline)
        return self.admit_outcome(route, cost, done)

    def lease_flow(
        self, route: Route, cost: Cost, op: AdmitOp, deadline: float | None = None
    ) -> Flow[Reservation | Denied]:
        """``op`` decided with local leases (``lease.py``): from a lease or a remembered
        denial in the process, else on the backend, borrowing."""
        leases = self.leases
        assert leases is not None
        local = leases.take(op, route, cost)
        if local is not None:
            yield from self._renew(op)
            return local
        send = leases.borrow(op)
        sent = self._clock.monotonic()
        try:
            done = yield Do(send, deadline=deadline)
        except BaseException:  # an error, a cancellation, the flow closed: no answer
            leases.abandon(send)
            raise
        outcome = self.admit_outcome(route, cost, leases.borrowed(send, done, sent))
        leases.decided(op, outcome, sent)
        yield from self._renew(op)
        return outcome

    def _renew(self, op: AdmitOp) -> Flow[None]:
        """Book the plan's next lease off this caller's path, when one is due (never on the
        local fallback: it lends nothing)."""
        assert self._renewals is not None
        renewal = None if self._runner.falling_back else self._renewals.renewal(op)
        if renewal is not None:
            yield Spawn(self._renew_flow(renewal))

    def _renew_flow(self, renewal: Renewal) -> Flow[None]:
        """Ask for a plan's next lease (``lease.py``, "Renewal ahead of need")."""
        renewals = self._renewals
        assert renewals is not None
        sent = self._clock.monotonic()
        try:
            done = yield Do(renewal.op, shared=True)
        except BaseException:  # an error, a cancellation, the flow closed: try again later
            renewals.renew_failed(renewal)
            raise
        result: AdmitResult = done[0]
        local: bool = done[2]
        self._heard(result, renewal.op.plan, local)
        renewals.renewed(renewal, result, local, sent)

    def _heard(self, result: AdmitResult, plan: AdmitPlan, local: bool) -> None:
        """What an admission's answer tells the process beyond the decision: refusals it
        may not know of yet (each in its scope), and a start booked ahead on the shared
        backend (a fallback must not overtake it)."""
        if result.refused:
            self._refusals.note(result.refused, local)
        if result.starts_in > 0.0 and not local:
            self._runner.booked_ahead(plan.scopes, result.starts_in)

    def returns(self) -> list[ReturnOp]:
        """What closing gives back of the leases (none without leases)."""
        return [] if self.leases is None else self.leases.returns()

    def _never_fits(self, check: Check, amount: float) -> Denied:
        return Denied(
            retry_after=0.0,
            scope=check.scope,
            dimension=check.dimension,
            reason=(
                f"cost of {amount:g} {check.dimension.value} exceeds the limit "
                f"of {check.ceiling:g}; waiting cannot help"
            ),
            never_fits=True,
        )

    def _denied(self, result: AdmitResult) -> Denied:
        scope = result.scope or ""
        dim = result.dimension
        wait = result.wait
        if result.paused_reason is not None:
            wait += pause_spread(wait, self._rng.random())
        # At least MIN_RETRY_AFTER: a wait of 0 or a few ulps (a level a rounding
        # error above its allowance) would have the caller ask again at the same instant.
        return Denied(
            retry_after=max(clamp_wait(wait) or 0.0, MIN_RETRY_AFTER),
            scope=scope,
            dimension=dim,
            reason=denial_reason(dim, result.paused_reason),
        )

    def reserve_flow(
        self, route: Route, cost: Cost, priority: str | Priority, deadline: float | None
    ) -> Flow[Reservation]:
        while True:
            # Book a start rather than poll: the caller sleeps exactly until its turn,
            # first come first served, as far ahead as its deadline allows.
            book = MAX_BOOK_SECONDS
            if deadline is not None:
                book = min(book, max(0.0, deadline - self._clock.monotonic()))
            outcome = yield from self.admit_flow(route, cost, priority, deadline, book)
            if isinstance(outcome, Reservation):
                if outcome.starts_in > 0:
                    yield Sleep(outcome.starts_in)
                    if outcome.stale:  # a refusal since the booking: give it back, ask again
                        op = outcome.claim_release()
                        if op is not None:
                            self._runner.settled((yield Do(op, local=outcome.local)))
                        continue
                return outcome
            if outcome.never_fits:
                raise AdmissionRejected(outcome)
            wait = outcome.retry_after
            if deadline is not None and self._clock.monotonic() + wait > deadline:
                raise AdmissionTimeout(
                    outcome,
                    retry_after=wait,
                    retry_at=self._clock.now() + timedelta(seconds=wait),
                )
            yield Sleep(wait)


def booked(op: AdmitOp, book: float) -> AdmitOp:
    """``op`` booked up to ``book`` seconds ahead, where its plan allows a booking."""
    if book and op.plan.bookable:  # ``op._replace(book=book)`` without its Python-level call
        return _new_tuple(AdmitOp, (op[0], op[1], op[2], op[3], op[4], book))
    return op
