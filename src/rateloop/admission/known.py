"""What the limiter knows of the limits: configured, learned from the provider, planned.

How it works.  :class:`KnownLimits` holds the limits in force -- those
configured with ``set_limits`` and those learned from the provider's headers
and refusals (:class:`~rateloop.admission.learning.Learned`) -- and the
admission plans built from them, cached per route and priority.  On a shared
backend what one process learned reaches the others through
:meth:`KnownLimits.refresh_op` and :meth:`KnownLimits.adopt`.  It runs no
flow and touches no backend: the admission flows (``admit.py``) read its
plans, the flows that learn from the provider (``feedback.py``) write to it.

The cold start.  A route with no limits on any of its scopes -- nothing
configured, nothing learned yet -- would send every call at once, and a
fleet's first wave can be larger than the provider's bucket: its first
answers would be 429s.  Until the route's provider scope has answered once in
this process (:meth:`KnownLimits.answered`: the first settle or release of a
call admitted cold), or for at most :data:`COLD_START_SECONDS`, at most
``cold_start`` calls of it are in flight (a concurrency check on the provider
scope, shared through the backend).  The
first answer's headers teach the limits and the burst, and a provider that
sends none is not limited after it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from rateloop.admission.learning import Learned, LearnedOp, Streaks, path, stretched
from rateloop.admission.plan import AdmitPlan, Check, CheckKind, Tightening, build_checks
from rateloop.admission.profile import AccountingProfile, profile_for
from rateloop.admission.spec import LimitSpec
from rateloop.route import Priority, Route
from rateloop.signal import Kind, LimitSignal

__all__ = ["KnownLimits"]

log = logging.getLogger("rateloop.admission")

_NO_PLAN = AdmitPlan((), (), Priority.INTERACTIVE)
#: Calls of a route with no known limits in flight at once until its provider answers.
COLD_START_CALLS = 8
#: ... and at most this long after the route's first cold admission in this process: a
#: first answer that takes longer (an agent's long step) comes too late to be worth the wait.
COLD_START_SECONDS = 30.0
#: A cold-start slot a process never gave back (it died) is free again after this.
_COLD_START_TTL = 120.0
_PLAN_CACHE_SIZE = 4096
_PRIORITIES: dict[object, Priority] = {p: p for p in Priority} | {p.value: p for p in Priority}


class KnownLimits:
    """The limits in force (configured and learned) and the plans built from them.

    ``shared``: the backend is shared by other processes (not ``memory://``),
    so what is learned is written to it and read back from it.
    """

    def __init__(self, *, shared: bool, cold_start: int = COLD_START_CALLS) -> None:
        self._lock = threading.Lock()
        self.cold_start = cold_start
        self._answered: set[str] = set()  # provider scopes past their cold start
        self._cold_since: dict[str, float] = {}  # provider scope -> its first cold admission
        self._limits: dict[str, LimitSpec] = {}
        self.shared = shared
        self.learned = Learned(self._limits.__contains__, shared=shared)
        self._plans: dict[tuple[Route, Priority], AdmitPlan] = {}
        self._last_plan: tuple[object, object, AdmitPlan] = (None, None, _NO_PLAN)
        self._generation = 0
        self._warned: set[tuple[str, str, int]] = set()
        self._streaks = Streaks()

    # -- configuration --------------------------------------------------------------

    def set_limits(self, scope: str, spec: LimitSpec | None) -> None:
        """Configure (or with ``None`` remove) the limits of ``scope``."""
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"scope must be a non-empty string, got {scope!r}")
        if spec is not None and not isinstance(spec, LimitSpec):
            raise TypeError(f"limits for {scope!r} must be a LimitSpec, got {spec!r}")
        with self._lock:
            if spec is None:
                self._limits.pop(scope, None)
            else:
                self._limits[scope] = spec
            # Configured again: what the provider stated for it is learned anew.
            self.learned.forget_stated(scope)
            self._forget_plans()

    def profile_of(self, scope: str) -> AccountingProfile:
        """How the provider of ``scope`` charges usage: the nearest scope's ``profile``
        setting on its path, else the profile of its provider (the first part)."""
        for candidate in path(scope):
            spec = self.limits_for(candidate)
            if spec is not None and spec.profile is not None:
                return profile_for(scope, spec.profile)
        return profile_for(scope.split(":", 1)[0])

    def limits_for(self, scope: str) -> LimitSpec | None:
        """The limits in force in ``scope``: configured, else learned from headers, else None.

        A configured limit the provider's headers state lower (for this very
        scope) is in force at the provider's value.

        Without a configured ``burst``, the burst learned from the provider's
        headers (its bucket, when it holds less than a minute) is the spec's
        ``burst``; without either, the profile's pacing applies.
        """
        spec = self._limits.get(scope)
        if spec is not None:
            lower: dict[str, Any] = self.stated_below(scope, spec)
            if lower:  # the provider enforces less than configured: its limit binds
                spec = replace(spec, **lower)
        else:
            spec = self.learned.specs.get(scope)
        if spec is not None and spec.burst is None:
            burst = self.learned.burst(scope)
            if burst is not None:
                return replace(spec, burst=burst)
        return spec

    @property
    def limits(self) -> Mapping[str, LimitSpec]:
        """The configured limits (a copy)."""
        return dict(self._limits)

    def configured(self, scope: str) -> LimitSpec | None:
        """The limits configured for ``scope`` itself (None: none, learned ones may apply)."""
        return self._limits.get(scope)

    def configured_scopes(self) -> list[str]:
        return sorted(self._limits)

    def plan(self, route: Route, priority: str | Priority) -> AdmitPlan:
        """The checks of a route at a priority, built once and cached.

        The plan does not depend on the cost, so a loop whose estimates change
        on every call still finds it.  The same call again is recognised by
        identity -- the route and the priority argument as given -- which
        skips hashing the route and parsing the priority.  ``_last_plan`` is
        replaced only under ``_lock`` and checked against the generation
        there, so a plan built from limits that changed meanwhile is never
        remembered.
        """
        last = self._last_plan
        if last[0] is route and last[1] is priority:
            return last[2]
        prio = _PRIORITIES.get(priority) or Priority.parse(priority)
        key = (route, prio)
        plan = self._plans.get(key)
        generation = self._generation
        if plan is None:
            scopes = route.scopes
            specs = [(scope, self.limits_for(scope)) for scope in scopes]
            profile = self.profile_of(scopes[-1])
            checks: list[Check] = []
            for scope, spec in specs:
                if spec is not None:
                    checks.extend(build_checks(scope, spec, prio, profile))
            cold = None
            if not checks and self.cold_start and route.provider_scope not in self._answered:
                cold = route.provider_scope
                checks.extend(build_checks(cold, LimitSpec(
                    concurrency=self.cold_start, lease_ttl_secs=_COLD_START_TTL), prio, profile))
            plan = AdmitPlan(scopes, tuple(checks), prio, profile)
            plan.cold_scope = cold
            # Something can be learned: limits (nothing configured on the route) or
            # the provider's burst (a configured scope without ``burst``).
            configured = [self._limits[s] for s in scopes if s in self._limits]
            plan.learnable = not configured or any(c.burst is None for c in configured)
        with self._lock:
            if generation != self._generation:  # limits changed meanwhile
                return plan
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = plan
            self._last_plan = (route, priority, plan)
        return plan

    def answered(self, scope: str) -> None:
        """A call admitted in ``scope``'s cold start has its answer: the cold start ends."""
        with self._lock:
            self._cold_since.pop(scope, None)
            if scope in self._answered:
                return
            if len(self._answered) >= _PLAN_CACHE_SIZE:
                self._answered.clear()
            self._answered.add(scope)
            self._forget_plans()

    def cold_expired(self, scope: str, now: float) -> bool:
        """True when ``scope``'s cold start has lasted :data:`COLD_START_SECONDS`: it ends."""
        with self._lock:
            if len(self._cold_since) >= _PLAN_CACHE_SIZE:
                self._cold_since.clear()
            since = self._cold_since.setdefault(scope, now)
        if now - since < COLD_START_SECONDS:
            return False
        self.answered(scope)
        return True

    def forget_plans(self) -> None:
        """Limits changed (configured, or learned): cached plans are stale."""
        with self._lock:
            self._forget_plans()

    def _forget_plans(self) -> None:
        """:meth:`forget_plans` with ``_lock`` held."""
        self.learned.forget_schedule()
        self._generation += 1
        self._plans.clear()
        self._last_plan = (None, None, _NO_PLAN)

    # -- what the provider said ----------------------------------------------------

    def refresh_op(self, route: Route, priority: str | Priority, now: float) -> LearnedOp | None:
        """On a shared backend: read what other processes learned, when due.

        Only routes that can learn something ask (``plan.learnable``, known
        from the cached plan without hashing the route): limits where none
        are configured, the provider's burst where no ``burst`` is; a route
        in its cold start reads on every admission.
        """
        plan = self.plan(route, priority)
        if not plan.learnable:
            return None
        if plan.cold_scope is not None:
            # In the cold start every admission reads first: the moment another
            # process learns the limits, this one admits by them too.
            return LearnedOp(scopes=route.scopes) if self.shared else None
        return self.learned.refresh_op(route, now)

    def adopt(self, learned: Mapping[str, Mapping[str, float]] | None) -> None:
        """Take what other processes learned (the answer to :meth:`refresh_op`)."""
        if self.learned.apply(learned):
            with self._lock:
                self._forget_plans()

    def stated_below(self, scope: str, spec: LimitSpec) -> dict[str, int]:
        """The limits the provider states for ``scope`` below its configured ``spec``."""
        return {n: v for n, v in self.learned.stated.get(scope, {}).items()
                if (mine := getattr(spec, n)) is not None and v < mine}

    def warn_stated(self, scope: str) -> None:
        """Say once per value when the provider states less than was configured."""
        configured = self._limits.get(scope)
        if configured is None:
            return
        for name, value in self.stated_below(scope, configured).items():
            if (scope, name, value) not in self._warned:
                self._warned.add((scope, name, value))
                log.warning("%s: the provider states %s = %d, below the configured %d: "
                            "admitting at the provider's limit", scope, name, value,
                            getattr(configured, name))

    def stretch_blocks(
        self,
        target: str,
        signal: LimitSignal,
        tightenings: tuple[Tightening, ...],
        *,
        now: float,
        draw: Callable[[], float],
    ) -> tuple[Tightening, ...]:
        """Refused again after waiting what the provider said: wait longer.

        Zero-config processes share no limiter: each waits out the block a
        refusal states and they come back together; a refused request still
        spends its slot, so together they keep the provider's bucket empty
        and nobody is served.  On a scope with learned limits only, a 429
        that arrives after this limiter's previous block ended (it waited as
        told and was refused anyway) stretches the per-minute blocks it
        states (see :class:`~rateloop.admission.learning.Streaks`).
        Configured scopes are left as they are: their refusals are rare, and
        a shared backend already coordinates their processes.
        """
        if target in self._limits:
            return tightenings

        def stretchable(t: Tightening) -> bool:
            return (t.check.kind is CheckKind.BUCKET and t.reset_after is not None
                    and t.reset_after > 0 and (t.remaining is None or t.remaining < 1))

        blocks = [t.reset_after for t in tightenings if stretchable(t) and t.reset_after]
        factor = self._streaks.observe(
            target, ok=signal.kind is Kind.OK, refused=signal.kind is Kind.TEMPORARY,
            wait=max(blocks, default=0.0), now=now, draw=draw,
        )
        if factor == 1.0:
            return tightenings
        return tuple(
            replace(t, reset_after=stretched(t.reset_after, factor))
            if stretchable(t) and t.reset_after is not None else t
            for t in tightenings
        )

    def governing(self, scope: str) -> str | None:
        """The nearest scope on ``scope``'s path (itself, then its ancestors) with limits.

        The loop observes on a route's provider scope (``provider:model[:project]``)
        while the limits may be configured on a broader scope; what the provider
        said is about the limit that governs the call, so it applies there.
        """
        for candidate in path(scope):
            if self.limits_for(candidate) is not None:
                return candidate
        return None

