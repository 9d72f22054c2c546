"""The shared limiter: reserve capacity in every scope of a route, at once.

How it works.  Each public method runs a generator (a *flow*) that yields
steps -- "run this operation on the backend" or "sleep this long" -- and
receives their results; the :class:`~rateloop.admission.runner.BackendRunner`
runs a flow with blocking calls (``run``) or awaits (``arun``).  The
algorithm (build the checks, interpret the answer, wait, give up at the
deadline) is written once, in the flows; the backend does one atomic
operation per step, so ``try_reserve`` is exactly one round trip.

When the backend is unreachable the limiter either raises
:class:`~rateloop.errors.BackendError` (``on_unreachable="fail_closed"``, the
default) or falls back to a per-process memory limiter holding
``local_share`` of every limit (``"local"``) -- N processes that all fall
back then admit at most ``N × local_share`` of a limit.  It tries the shared
backend again after :data:`LOCAL_RETRY_SECONDS` (``runner.py``).

:class:`Limiter` is a composition; it holds four collaborators and shares no
private state with them.  The arrows point one way::

    Limiter ──> Admissions ──> KnownLimits
       │            ├────────> Leases ──> Refusals (local leases, when on)
       │            └────────> BackendRunner ──> Refusals, Backend
       └──────> Feedback ────> KnownLimits, Refusals

* :class:`~rateloop.admission.runner.BackendRunner` (``runner.py``) performs
  the flows' steps on the backend, with the local fallback, and keeps the
  :class:`~rateloop.admission.runner.Refusals` the backends report;
* :class:`~rateloop.admission.known.KnownLimits` (``known.py``): the limits
  in force (configured and learned) and the plans built from them;
* :class:`~rateloop.admission.admit.Admissions` (``admit.py``): the flows of
  ``try_reserve`` and ``reserve``, and the
  :class:`~rateloop.admission.reservation.Settler` each reservation calls back;
* :class:`~rateloop.admission.feedback.Feedback` (``feedback.py``): the flows
  behind ``observe`` and ``pause``, learning from the provider.

This module holds construction and the public twins.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import random
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, Protocol, cast

from rateloop._clock import Clock, system_clock
from rateloop.admission.admit import MAX_BOOK_SECONDS, MIN_RETRY_AFTER, Admissions, booked
from rateloop.admission.backends import Backend, MemoryBackend, backend_from_url
from rateloop.admission.feedback import Feedback
from rateloop.admission.gcra import AIMD
from rateloop.admission.known import COLD_START_CALLS, KnownLimits
from rateloop.admission.lease import lease_seconds
from rateloop.admission.profile import AccountingProfile
from rateloop.admission.reservation import Denied, Reservation
from rateloop.admission.runner import LOCAL_RETRY_SECONDS, BackendRunner
from rateloop.admission.spec import LimitSpec
from rateloop.errors import BackendError
from rateloop.route import Cost, Route
from rateloop.signal import LimitSignal


class AdmissionSettings(Protocol):
    """What :meth:`Limiter.from_policy` reads of a policy's ``[admission]`` table."""

    @property
    def backend(self) -> str: ...
    @property
    def on_unreachable(self) -> Literal["fail_closed", "local"]: ...
    @property
    def local_share(self) -> float: ...
    @property
    def cold_start(self) -> int: ...
    @property
    def local_lease_secs(self) -> float | None: ...


class LimiterSettings(Protocol):
    """What :meth:`Limiter.from_policy` reads (a :class:`~rateloop.policy.Policy` has it)."""

    @property
    def admission(self) -> AdmissionSettings: ...
    @property
    def limits(self) -> Mapping[str, LimitSpec]: ...

__all__ = ["LOCAL_RETRY_SECONDS", "MAX_BOOK_SECONDS", "MIN_RETRY_AFTER", "Limiter"]


class Limiter:
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
        cold_start: int = COLD_START_CALLS,
        local_lease_secs: float | None = None,
    ) -> None:
        if type(cold_start) is not int or cold_start < 0:
            raise ValueError(
                f"cold_start must be a whole number of calls, 0 or more (0: no cold start), "
                f"got {cold_start!r}"
            )
        self.aimd = aimd or AIMD()
        self._runner = runner = BackendRunner(
            backend, clock=clock, on_unreachable=on_unreachable, local_share=local_share
        )
        self._clock = runner.clock
        rng = rng or random.Random()
        # Learned limits go through the backend when other processes share it.
        self._known = known = KnownLimits(
            shared=not isinstance(runner.backend, MemoryBackend), cold_start=cold_start
        )
        # Local leases (``lease.py``, off by default): borrow in slices, decide in the process.
        self._admissions = Admissions(
            known, runner, rng=rng, aimd=self.aimd, lease_secs=lease_seconds(local_lease_secs)
        )
        self._feedback = Feedback(
            known, runner.refusals, clock=runner.clock, rng=rng, aimd=self.aimd
        )
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
        cold_start: int = COLD_START_CALLS,
        local_lease_secs: float | None = None,
        **options: Any,
    ) -> Limiter:
        """A limiter on the backend named by ``url`` (``memory://``, ``redis://...``).

        ``options`` go to the backend (for Redis: ``socket_timeout``,
        ``socket_connect_timeout``, ...).  ``local_lease_secs``: borrow capacity
        in slices that live that long and decide most admissions in the process
        (docs/admission.md, "Local leases"); None (the default): every
        admission is one round trip.
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
            cold_start=cold_start,
            local_lease_secs=local_lease_secs,
        )

    @classmethod
    def from_policy(
        cls,
        policy: LimiterSettings,
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
            cold_start=admission.cold_start,
            local_lease_secs=admission.local_lease_secs,
            **options,
        )

    def __repr__(self) -> str:
        return (
            f"Limiter({self._runner.backend.url!r}, scopes={self._known.configured_scopes()}, "
            f"on_unreachable={self._runner.on_unreachable!r})"
        )

    @property
    def backend(self) -> Backend:
        return self._runner.backend

    # -- the limits in force --------------------------------------------------------------

    def set_limits(self, scope: str, spec: LimitSpec | None) -> None:
        """Configure (or with ``None`` remove) the limits of ``scope``."""
        self._known.set_limits(scope, spec)

    def limits_for(self, scope: str) -> LimitSpec | None:
        """The limits in force in ``scope``: configured, else learned from headers, else None.

        A configured limit the provider's headers state lower (for this very
        scope) is in force at the provider's value.

        Without a configured ``burst``, the burst learned from the provider's
        headers (its bucket, when it holds less than a minute) is the spec's
        ``burst``; without either, the profile's pacing applies.
        """
        return self._known.limits_for(scope)

    def profile_of(self, scope: str) -> AccountingProfile:
        """How the provider of ``scope`` charges usage: the nearest scope's ``profile``
        setting on its path, else the profile of its provider (the first part)."""
        return self._known.profile_of(scope)

    @property
    def limits(self) -> Mapping[str, LimitSpec]:
        """The configured limits (a copy)."""
        return self._known.limits

    # -- flows: the algorithm, written once ----------------------------------------------

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

        This is ``Admissions.admit_flow`` run by hand: the same two halves
        around one step, without a generator, because it is the hottest path.
        """
        admissions = self._admissions
        if (refresh := admissions.refresh_op(route, priority)) is not None:
            admissions.adopt(self._runner.execute(refresh))
        op = admissions.admit_op(route, cost, priority)
        if isinstance(op, Denied):
            return op
        if book_within is not None:
            op = booked(op, _book_seconds(book_within))
        if admissions.leases is not None:
            return self._runner.run(admissions.lease_flow(route, cost, op))
        return admissions.admit_outcome(route, cost, self._runner.execute(op))

    async def atry_reserve(
        self,
        route: Route,
        cost: Cost,
        *,
        priority: str = "interactive",
        book_within: float | None = None,
    ) -> Reservation | Denied:
        admissions = self._admissions
        if (refresh := admissions.refresh_op(route, priority)) is not None:
            admissions.adopt(await self._runner.aexecute(refresh))
        op = admissions.admit_op(route, cost, priority)
        if isinstance(op, Denied):
            return op
        if book_within is not None:
            op = booked(op, _book_seconds(book_within))
        if admissions.leases is not None:
            return await self._runner.arun(admissions.lease_flow(route, cost, op))
        return admissions.admit_outcome(route, cost, await self._runner.aexecute(op))

    def try_book(
        self, route: Route, cost: Cost, priority: str, within: float
    ) -> Reservation | Denied:
        """``try_reserve(route, cost, priority=priority, book_within=within)``, positionally.

        What the loop's :class:`~rateloop.loop.effects.Book` effect calls.  A
        subclass whose ``try_reserve`` predates ``book_within`` (a user's
        recording or wrapping limiter) is asked without it (no booking) rather
        than given an argument it rejects.
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
        flow = self._admissions.reserve_flow(route, cost, priority, self._until(deadline))
        return self._runner.run(flow)

    async def areserve(
        self,
        route: Route,
        cost: Cost,
        *,
        priority: str = "interactive",
        deadline: datetime | float | None = None,
    ) -> Reservation:
        """Await capacity; see :meth:`reserve`."""
        flow = self._admissions.reserve_flow(route, cost, priority, self._until(deadline))
        return await self._runner.arun(flow)

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

    def voided(self, route: Route, start: float) -> bool:
        """Has a refusal this process knows of voided a start booked on ``route`` at ``start``?

        ``start`` is in the backend's time: a booking's ``granted_at + starts_in``.  What
        :attr:`Reservation.stale` checks, for a booking carried to another process (an engine
        attempt that hands back to a booked start); no round trip.
        """
        return self._admissions.refused_before(route.scopes, start, False)

    def pause(self, scope: str, until: datetime | float, reason: str) -> None:
        """Pause ``scope`` (and every narrower scope) for every worker until ``until``.

        ``until`` is an aware datetime or seconds from now.  A pause is never
        shortened by a later, shorter one.
        """
        self._runner.run(self._feedback.pause_flow(scope, until, reason))

    async def apause(self, scope: str, until: datetime | float, reason: str) -> None:
        await self._runner.arun(self._feedback.pause_flow(scope, until, reason))

    def observe(self, scope: str, headers_or_signal: LimitSignal | Mapping[str, str]) -> None:
        """Learn from the provider's headers (or a classified signal) for ``scope``."""
        self._runner.run(self._feedback.observe_flow(scope, headers_or_signal))

    async def aobserve(
        self, scope: str, headers_or_signal: LimitSignal | Mapping[str, str]
    ) -> None:
        await self._runner.arun(self._feedback.observe_flow(scope, headers_or_signal))

    def close(self) -> None:
        """Give back what is left of the local leases, then close the backend.

        Lease renewals under way finish first (at most a few seconds); none
        starts after.
        """
        self._runner.spawned.stop()
        backend = self._runner.backend
        for op in self._admissions.returns():
            with contextlib.suppress(BackendError):  # unreachable: it drains instead
                backend.execute(op)
        backend.close()

    async def aclose(self) -> None:
        await self._runner.spawned.astop()
        backend = self._runner.backend
        for op in self._admissions.returns():
            with contextlib.suppress(BackendError):
                await backend.aexecute(op)
        await backend.aclose()


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
    if type(within) is float and 0.0 <= within <= MAX_BOOK_SECONDS:
        return within  # the loop's own booking horizon, every call: the fast path (NaN fails)
    if (
        isinstance(within, bool)
        or not isinstance(within, int | float)
        or math.isnan(within)
        or within < 0
    ):
        raise ValueError(f"book_within must be seconds >= 0 (or None), got {within!r}")
    return min(float(within), MAX_BOOK_SECONDS)
