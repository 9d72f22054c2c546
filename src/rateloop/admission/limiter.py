"""The shared limiter: reserve capacity in every scope of a route, at once.

How it works.  Each public method is a generator (a *flow*) that yields
steps -- "run this operation on the backend" or "sleep this long" -- and
receives their results; the :class:`~rateloop.admission._driver.BackendDriver`
it inherits runs a flow with blocking calls (``_drive``) or awaits
(``_adrive``).  The algorithm (build the checks, interpret the answer, wait,
give up at the deadline) is written once, in the flows; the backend does one
atomic operation per step, so ``try_reserve`` is exactly one round trip.

When the backend is unreachable the limiter either raises
:class:`~rateloop.errors.BackendError` (``on_unreachable="fail_closed"``, the
default) or falls back to a per-process memory limiter holding
``local_share`` of every limit (``"local"``) -- N processes that all fall
back then admit at most ``N × local_share`` of a limit.  It tries the shared
backend again after :data:`LOCAL_RETRY_SECONDS` (``_driver.py``).

The limits in force (configured and learned), the plans built from them and
the flows behind ``observe`` and ``pause`` (learning from the provider) are in
:class:`~rateloop.admission._known.KnownLimits` (``_known.py``), the base of
:class:`Limiter`; this module holds construction and admission.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import random
import secrets
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from rateloop._clock import Clock, system_clock
from rateloop.admission._driver import LOCAL_RETRY_SECONDS, _Do, _Done, _Flow, _Sleep
from rateloop.admission._known import KnownLimits
from rateloop.admission.backend import Backend, backend_from_url
from rateloop.admission.gcra import AIMD, pause_spread
from rateloop.admission.plan import AdmitOp, AdmitResult, Check
from rateloop.admission.reservation import (
    AdmissionRejected,
    AdmissionTimeout,
    Denied,
    Reservation,
)
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Priority, Route
from rateloop.signal import LimitSignal, clamp_wait

if TYPE_CHECKING:
    from rateloop.policy import Policy

__all__ = ["LOCAL_RETRY_SECONDS", "MAX_BOOK_SECONDS", "MIN_RETRY_AFTER", "Limiter"]

#: A denial's ``retry_after`` is at least this long (seconds).
MIN_RETRY_AFTER = 0.001
#: The furthest ahead a start is booked (``reserve`` without a deadline books up to this).
MAX_BOOK_SECONDS = 3600.0

T = TypeVar("T")


_NO_REFUSAL = -math.inf
_new_tuple = tuple.__new__


class Limiter(KnownLimits):
    """Admission across requests, tokens, day quotas and concurrency of every scope.

    >>> from rateloop.testing import FakeClock
    >>> limiter = Limiter(limits={"openai:gpt-5": LimitSpec(requests_per_minute=60)},
    ...                   clock=FakeClock())
    >>> r = limiter.try_reserve(Route(provider="openai", model="gpt-5"), Cost())
    >>> r.settle(0, 0)
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        limits: Mapping[str, LimitSpec] | None = None,
        clock: Clock | None = None,
        on_unreachable: Literal["fail_closed", "local"] = "fail_closed",
        local_share: float = 1.0,
        aimd: AIMD | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(
            backend,
            clock=clock,
            on_unreachable=on_unreachable,
            local_share=local_share,
            aimd=aimd,
        )
        self._rng = rng or random.Random()
        # Lease ids: unique across processes (random prefix), cheap within one.
        self._lease_prefix = secrets.token_hex(6) + "-"
        self._lease_counter = itertools.count()
        for scope, spec in (limits or {}).items():
            self.set_limits(scope, spec)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "rateloop:",
        limits: Mapping[str, LimitSpec] | None = None,
        clock: Clock | None = None,
        on_unreachable: Literal["fail_closed", "local"] = "fail_closed",
        local_share: float = 1.0,
        aimd: AIMD | None = None,
        rng: random.Random | None = None,
        **options: Any,
    ) -> Limiter:
        """A limiter on the backend named by ``url`` (``memory://``, ``redis://...``).

        ``options`` go to the backend (for Redis: ``socket_timeout``,
        ``socket_connect_timeout``, ...).
        """
        clk = clock or system_clock
        backend = backend_from_url(url, clock=clk, prefix=prefix, **options)
        return cls(
            backend,
            limits=limits,
            clock=clk,
            on_unreachable=on_unreachable,
            local_share=local_share,
            aimd=aimd,
            rng=rng,
        )

    @classmethod
    def from_policy(
        cls,
        policy: Policy,
        *,
        prefix: str = "rateloop:",
        clock: Clock | None = None,
        **options: Any,
    ) -> Limiter:
        """The limiter a policy describes: its ``[admission]`` table and ``[limits]``.

        >>> from rateloop.policy import Policy
        >>> Limiter.from_policy(Policy.from_dict({"limits": {"openai:gpt-5": {"concurrency": 4}}}))
        Limiter('memory://', scopes=['openai:gpt-5'], on_unreachable='fail_closed')
        """
        admission = policy.admission
        return cls.from_url(
            admission.backend,
            prefix=prefix,
            limits=policy.limits,
            clock=clock,
            on_unreachable=admission.on_unreachable,
            local_share=admission.local_share,
            **options,
        )

    def __repr__(self) -> str:
        return (
            f"Limiter({self._backend.url!r}, scopes={sorted(self._limits)}, "
            f"on_unreachable={self._on_unreachable!r})"
        )

    @property
    def backend(self) -> Backend:
        return self._backend

    # -- flows: the algorithm, written once ----------------------------------------------

    def _admit_op(self, route: Route, cost: Cost, priority: str | Priority) -> AdmitOp | Denied:
        """First half of an admission: the operation to run, or a denial needing none.

        The plan (cached per route and priority) gives the checks; only the
        amounts and allowances are computed from ``cost``, and not even those
        when the cost is the previous call's (``plan.last``, which also keeps
        the whole operation when no lease id makes each one unique).
        """
        plan = self._plan(route, priority)
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

    def _admit_outcome(self, route: Route, cost: Cost, done: _Done) -> Reservation | Denied:
        """Second half: interpret the backend's answer (an AdmitResult for the AdmitOp run)."""
        result: AdmitResult = done[0]
        ran: AdmitOp = done[1]
        if result.refused_until > _NO_REFUSAL:  # a refusal this process may not know of yet
            self._note_refused(ran.plan.scopes, result.refused_until, done[2])
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

    def _admit_flow(
        self,
        route: Route,
        cost: Cost,
        priority: str | Priority,
        deadline: float | None = None,
        book: float = 0.0,
    ) -> _Flow[Reservation | Denied]:
        if self._learned_shared and (refresh := self._refresh_op(route, priority)) is not None:
            self._adopt((yield _Do(refresh, deadline=deadline)))
        op = self._admit_op(route, cost, priority)
        if isinstance(op, Denied):
            return op
        if book and op.plan.bookable:
            op = op._replace(book=book)
        done = yield _Do(op, deadline=deadline)
        return self._admit_outcome(route, cost, done)

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
            reason = f"scope paused: {result.paused_reason}"
        else:
            reason = f"{dim.value if dim else 'capacity'} limit reached"
        # At least MIN_RETRY_AFTER: a wait of 0 or a few ulps (a level a rounding
        # error above its allowance) would have the caller ask again at the same instant.
        return Denied(
            retry_after=max(clamp_wait(wait) or 0.0, MIN_RETRY_AFTER),
            scope=scope,
            dimension=dim,
            reason=reason,
        )

    def _reserve_flow(
        self, route: Route, cost: Cost, priority: str | Priority, deadline: float | None
    ) -> _Flow[Reservation]:
        while True:
            # Book a start rather than poll: the caller sleeps exactly until its turn,
            # first come first served, as far ahead as its deadline allows.
            book = MAX_BOOK_SECONDS
            if deadline is not None:
                book = min(book, max(0.0, deadline - self._clock.monotonic()))
            outcome = yield from self._admit_flow(route, cost, priority, deadline, book)
            if isinstance(outcome, Reservation):
                if outcome.starts_in > 0:
                    yield _Sleep(outcome.starts_in)
                    if outcome.stale:  # a refusal since the booking: give it back, ask again
                        op = outcome._release_op()
                        if outcome._claim() and op is not None:
                            self._settled((yield _Do(op, local=outcome.local)))
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
            yield _Sleep(wait)

    # -- the public twins -------------------------------------------------------------------------

    def try_reserve(
        self,
        route: Route,
        cost: Cost,
        *,
        priority: str = "interactive",
        book_within: float | None = None,
    ) -> Reservation | Denied:
        """Reserve now or say why not and for how long; one backend round trip.

        ``book_within`` (seconds): when only the rate buckets (requests,
        tokens) make the call wait, and at most that long, grant it now with
        a start ahead -- ``reservation.starts_in`` seconds, which the caller
        must wait before calling.  The buckets are charged at once, so later
        callers queue behind it, first come first served, instead of all
        polling.  Never booked: a paused scope, a day quota, a concurrency
        slot, a provider's block, or a lower priority class where a
        ``reserve`` is kept for the higher ones.  ``None`` (the default):
        grant only what fits now.

        This is ``_admit_flow`` run by hand: the same two halves around one
        step, without a generator, because it is the hottest path.
        """
        if self._learned_shared and (refresh := self._refresh_op(route, priority)) is not None:
            self._adopt(self._execute(refresh))
        op = self._admit_op(route, cost, priority)
        if isinstance(op, Denied):
            return op
        if book_within is not None and (book := _book_seconds(book_within)) and op.plan.bookable:
            op = op._replace(book=book)
        return self._admit_outcome(route, cost, self._execute(op))

    async def atry_reserve(
        self,
        route: Route,
        cost: Cost,
        *,
        priority: str = "interactive",
        book_within: float | None = None,
    ) -> Reservation | Denied:
        if self._learned_shared and (refresh := self._refresh_op(route, priority)) is not None:
            self._adopt(await self._aexecute(refresh))
        op = self._admit_op(route, cost, priority)
        if isinstance(op, Denied):
            return op
        if book_within is not None and (book := _book_seconds(book_within)) and op.plan.bookable:
            op = op._replace(book=book)
        return self._admit_outcome(route, cost, await self._aexecute(op))

    def try_book(
        self, route: Route, cost: Cost, priority: str, within: float
    ) -> Reservation | Denied:
        """``try_reserve(route, cost, priority=priority, book_within=within)``, positionally.

        For the loop, whose limiter effects pass positional arguments.  A
        subclass whose ``try_reserve`` predates ``book_within`` is asked
        without it (no booking) rather than given an argument it rejects.
        """
        if _books(type(self).try_reserve):
            return self.try_reserve(route, cost, priority=priority, book_within=within)
        return self.try_reserve(route, cost, priority=priority)

    async def atry_book(
        self, route: Route, cost: Cost, priority: str, within: float
    ) -> Reservation | Denied:
        if _books(type(self).atry_reserve):
            return await self.atry_reserve(route, cost, priority=priority, book_within=within)
        return await self.atry_reserve(route, cost, priority=priority)

    def reserve(
        self,
        route: Route,
        cost: Cost,
        *,
        priority: str = "interactive",
        deadline: datetime | float | None = None,
    ) -> Reservation:
        """Wait until every dimension of every scope admits ``cost`` at once.

        ``deadline`` is an aware datetime or seconds from now (as for
        :meth:`rateloop.RateLoop.call`); when the wait would pass it, raise
        :class:`AdmissionTimeout` at once instead of waiting.  A cost that can
        never fit raises :class:`AdmissionRejected`.
        """
        return self._drive(self._reserve_flow(route, cost, priority, self._until(deadline)))

    async def areserve(
        self,
        route: Route,
        cost: Cost,
        *,
        priority: str = "interactive",
        deadline: datetime | float | None = None,
    ) -> Reservation:
        """Await capacity; see :meth:`reserve`."""
        return await self._adrive(self._reserve_flow(route, cost, priority, self._until(deadline)))

    def _until(self, deadline: datetime | float | None) -> float | None:
        """A deadline (aware datetime, or seconds from now) on the monotonic clock."""
        if deadline is None:
            return None
        if isinstance(deadline, datetime):
            if deadline.tzinfo is None:
                raise ValueError(f"deadline must be timezone-aware, got {deadline!r}")
            return self._clock.monotonic() + (deadline - self._clock.now()).total_seconds()
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise ValueError(
                f"deadline must be an aware datetime or seconds from now, got {deadline!r}"
            )
        return self._clock.monotonic() + float(deadline)

    def pause(self, scope: str, until: datetime | float, reason: str) -> None:
        """Pause ``scope`` (and every narrower scope) for every worker until ``until``.

        ``until`` is an aware datetime or seconds from now.  A pause is never
        shortened by a later, shorter one.
        """
        self._drive(self._pause_flow(scope, until, reason))

    async def apause(self, scope: str, until: datetime | float, reason: str) -> None:
        await self._adrive(self._pause_flow(scope, until, reason))

    def observe(self, scope: str, headers_or_signal: LimitSignal | Mapping[str, str]) -> None:
        """Learn from the provider's headers (or a classified signal) for ``scope``."""
        self._drive(self._observe_flow(scope, headers_or_signal))

    async def aobserve(
        self, scope: str, headers_or_signal: LimitSignal | Mapping[str, str]
    ) -> None:
        await self._adrive(self._observe_flow(scope, headers_or_signal))

    def close(self) -> None:
        self._backend.close()

    async def aclose(self) -> None:
        await self._backend.aclose()


@functools.cache
def _books(method: object) -> bool:
    """Does this ``try_reserve`` (an override's, maybe) take ``book_within``?"""
    try:
        params = inspect.signature(cast(Any, method)).parameters
    except (TypeError, ValueError):
        return False
    return "book_within" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def _book_seconds(within: object) -> float:
    """``book_within`` checked: a number of seconds >= 0, at most :data:`MAX_BOOK_SECONDS`."""
    if (
        isinstance(within, bool)
        or not isinstance(within, int | float)
        or math.isnan(within)
        or within < 0
    ):
        raise ValueError(f"book_within must be seconds >= 0 (or None), got {within!r}")
    return min(float(within), MAX_BOOK_SECONDS)
