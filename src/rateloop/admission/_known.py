"""What the limiter knows of the limits: configured, learned from the provider, planned.

How it works.  :class:`KnownLimits` is the half of the
:class:`~rateloop.admission.limiter.Limiter` that holds the limits in force
-- those configured with ``set_limits`` and those learned from the
provider's headers and refusals (:class:`~rateloop.admission.learning.Learned`)
-- and the admission plans built from them, cached per route and priority.
Its flows learn from the provider: ``_observe_flow`` resynchronises the
governing scope's buckets with the provider's ``remaining``/``reset``
headers, learns limits and bursts, records refusals and applies the AIMD
decrease; ``_pause_flow`` pauses a scope.  On a shared backend what one
process learned reaches the others through ``_refresh_op``/``_adopt``.  The
admission flows are in ``limiter.py``; both are run by the
:class:`~rateloop.admission._driver.BackendDriver` this class inherits.
"""

from __future__ import annotations

import importlib
import logging
import random
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal, cast

from rateloop._clock import Clock
from rateloop.admission._driver import BackendDriver, _Do, _Done, _Flow
from rateloop.admission.backend import Backend
from rateloop.admission.gcra import AIMD
from rateloop.admission.learning import (
    Learned,
    LearnedOp,
    Streaks,
    path,
    stretched,
    tightened,
)
from rateloop.admission.memory import MemoryBackend
from rateloop.admission.plan import (
    AdmitPlan,
    Check,
    CheckKind,
    ObserveOp,
    PauseOp,
    Tightening,
    build_checks,
)
from rateloop.admission.profile import AccountingProfile, profile_for
from rateloop.admission.spec import LimitSpec
from rateloop.admission.subscription import subscription_block
from rateloop.route import Priority, Route
from rateloop.signal import Dimension, Kind, LimitSignal, Observed, clamp_wait

__all__ = ["KnownLimits"]

log = logging.getLogger("rateloop.admission")

_NO_PLAN = AdmitPlan((), (), Priority.INTERACTIVE)
#: Signals that say the provider refused a call for capacity (recorded as a refusal).
_REFUSALS = frozenset({Kind.TEMPORARY, Kind.PERIOD_QUOTA})
_NO_SPEC = LimitSpec()
_PLAN_CACHE_SIZE = 4096
_PRIORITIES: dict[object, Priority] = {p: p for p in Priority} | {p.value: p for p in Priority}


class KnownLimits(BackendDriver):
    """The limits in force (configured and learned), the plans built from them, and
    the flows that learn from the provider; the base of
    :class:`~rateloop.admission.limiter.Limiter`."""

    _rng: random.Random  # the Limiter's

    def __init__(
        self,
        backend: Backend | None,
        *,
        clock: Clock | None,
        on_unreachable: Literal["fail_closed", "local"],
        local_share: float,
        aimd: AIMD | None,
    ) -> None:
        super().__init__(
            backend, clock=clock, on_unreachable=on_unreachable, local_share=local_share
        )
        self.aimd = aimd or AIMD()
        self._limits: dict[str, LimitSpec] = {}
        self._learned_shared = not isinstance(self._backend, MemoryBackend)
        self._learned = Learned(self._limits.__contains__, shared=self._learned_shared)
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
            self._learned.forget_stated(scope)
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
            lower: dict[str, Any] = self._stated_below(scope, spec)
            if lower:  # the provider enforces less than configured: its limit binds
                spec = replace(spec, **lower)
        else:
            spec = self._learned.specs.get(scope)
        if spec is not None and spec.burst is None:
            burst = self._learned.burst(scope)
            if burst is not None:
                return replace(spec, burst=burst)
        return spec

    @property
    def limits(self) -> Mapping[str, LimitSpec]:
        """The configured limits (a copy)."""
        return dict(self._limits)

    def _plan(self, route: Route, priority: str | Priority) -> AdmitPlan:
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
            plan = AdmitPlan(scopes, tuple(checks), prio, profile)
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

    def _forget_plans(self) -> None:
        """Limits changed: cached plans are stale.  Call with ``_lock`` held."""
        self._learned.forget_schedule()
        self._generation += 1
        self._plans.clear()
        self._last_plan = (None, None, _NO_PLAN)

    # -- learning from the provider ------------------------------------------------

    def _refresh_op(self, route: Route, priority: str | Priority) -> LearnedOp | None:
        """On a shared backend: read what other processes learned, when due.

        Only routes that can learn something ask (``plan.learnable``, known
        from the cached plan without hashing the route): limits where none
        are configured, the provider's burst where no ``burst`` is.
        """
        if not self._plan(route, priority).learnable:
            return None
        return self._learned.refresh_op(route, self._clock.monotonic())

    def _adopt(self, done: _Done) -> None:
        if self._learned.apply(done[0]):
            with self._lock:
                self._forget_plans()

    def _pause_flow(self, scope: str, until: datetime | float, reason: str) -> _Flow[None]:
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"scope must be a non-empty string, got {scope!r}")
        if isinstance(until, datetime):
            if until.tzinfo is None:
                raise ValueError(f"pause until must be timezone-aware, got {until!r}")
            seconds = (until - self._clock.now()).total_seconds()
        elif isinstance(until, int | float) and not isinstance(until, bool):
            seconds = float(until)
        else:
            raise TypeError(f"pause until must be a datetime or seconds, got {until!r}")
        wait = clamp_wait(seconds)
        if wait is None:
            raise ValueError(f"pause seconds must be a number, got {until!r}")
        if wait > 0:
            done = yield _Do(PauseOp(scope=scope, seconds=wait, reason=str(reason)))
            self._note_refused((scope,), done[0].until, done[2])

    def _stated_below(self, scope: str, spec: LimitSpec) -> dict[str, int]:
        """The limits the provider states for ``scope`` below its configured ``spec``."""
        return {n: v for n, v in self._learned.stated.get(scope, {}).items()
                if (mine := getattr(spec, n)) is not None and v < mine}

    def _warn_stated(self, scope: str) -> None:
        """Say once per value when the provider states less than was configured."""
        configured = self._limits.get(scope)
        if configured is None:
            return
        for name, value in self._stated_below(scope, configured).items():
            if (scope, name, value) not in self._warned:
                self._warned.add((scope, name, value))
                log.warning("%s: the provider states %s = %d, below the configured %d: "
                            "admitting at the provider's limit", scope, name, value,
                            getattr(configured, name))

    def _stretch_blocks(
        self, target: str, signal: LimitSignal, tightenings: tuple[Tightening, ...]
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
            wait=max(blocks, default=0.0), now=self._clock.monotonic(), draw=self._rng.random,
        )
        if factor == 1.0:
            return tightenings
        return tuple(
            replace(t, reset_after=stretched(t.reset_after, factor))
            if stretchable(t) and t.reset_after is not None else t
            for t in tightenings
        )

    def _governing(self, scope: str) -> str | None:
        """The nearest scope on ``scope``'s path (itself, then its ancestors) with limits.

        The loop observes on a route's provider scope (``provider:model[:project]``)
        while the limits may be configured on a broader scope; what the provider
        said is about the limit that governs the call, so it applies there.
        """
        for candidate in path(scope):
            if self.limits_for(candidate) is not None:
                return candidate
        return None

    def _observe_flow(self, scope: str, source: LimitSignal | Mapping[str, str]) -> _Flow[None]:
        """Resynchronise the governing scope's state with what the provider said.

        Header truth over guesswork: ``remaining``/``reset`` headers set the
        state of the dimensions they name, on every observed response.  The
        AIMD decrease applies only to a 429 that nothing explains -- no
        header told the state of a limit we govern, and no limit was just
        learned from it (the 429 that taught a limit is not a reason to go
        slower than that limit).
        """
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"scope must be a non-empty string, got {scope!r}")
        block: float | None = None
        if isinstance(source, LimitSignal):
            signal = source
        else:
            signal = _signal_from_headers(source, self._clock.now())
            block = subscription_block(source, self._clock.now())
        store = self._learned.learn(scope, signal)
        learned = store is not None
        if learned:
            with self._lock:
                self._forget_plans()
            if self._learned_shared:
                yield _Do(store)
        # A limit the headers state lower than configured binds on the scope they
        # describe -- the observed one, when it is configured -- never on a broader
        # one (a model's total over several projects or keys, a provider-wide scope).
        if self._learned.learn_stated(scope, signal):
            self._warn_stated(scope)
            with self._lock:
                self._forget_plans()
        target = self._governing(scope)
        if target is not None and (burst_op := self._learned.learn_burst(target, signal)):
            # The provider's bucket is short (or shorter than known): the target's
            # buckets take its capacity -- their levels stay, so a larger capacity
            # credits the difference, the headroom the provider has on top.
            if self._limits.get(target, _NO_SPEC).burst is None:
                with self._lock:
                    self._forget_plans()
            if self._learned_shared:
                yield _Do(burst_op)
        spec = self.limits_for(target) if target is not None else None
        by_dimension: dict[Dimension, Check] = {}
        if target is not None and spec is not None:
            for check in build_checks(target, spec, profile=self.profile_of(scope)):
                by_dimension[check.dimension] = check
        held = self._learned.burst(target) if target is not None else None
        tightenings = tuple(
            Tightening(
                check=by_dimension[d],
                remaining=o.remaining,
                reset_after=_next_unit(o, held, by_dimension[d]),
            )
            for o in signal.observed
            if o.remaining is not None or o.reset_after is not None
            for d in tightened(o)
            if d in by_dimension and by_dimension[d].kind is not CheckKind.LEASE
        )
        if target is not None:
            tightenings = self._stretch_blocks(target, signal, tightenings)
        lower = signal.kind is Kind.TEMPORARY and not tightenings and not learned
        # A refusal: the target records it, so that calls booked before it (in this
        # process and, through the shared backend, in others) are admitted again.
        refused = signal.kind in _REFUSALS
        if target is not None and (tightenings or lower or refused):
            op = ObserveOp(
                scope=target, tightenings=tightenings, lower=lower, aimd=self.aimd, refused=refused
            )
            done = yield _Do(op)
            if refused:
                self._note_refused((target,), done[0][1], done[2])
        if block is not None:
            yield _Do(PauseOp(scope=scope, seconds=block, reason="subscription window exhausted"))


def _next_unit(o: Observed, held: float | None, check: Check) -> float | None:
    """The reset that blocks ``check`` when the provider has nothing ``remaining``.

    A provider's ``reset`` is when its bucket is *full* again.  Without more
    knowledge that is when it admits again (a window that resets whole).  When
    its bucket is known to be a short, continuously refilled one (``held``,
    the learned burst), it admits its next unit one unit's refill after it
    was empty: ``reset`` less the bucket's length, plus ``1 / rate`` -- the
    level resync already holds that much, so the scope is not blocked for the
    whole refill while the provider admits again at its rate.
    """
    reset = o.reset_after
    if (
        reset is None
        or held is None
        or check.kind is not CheckKind.BUCKET
        or o.remaining is None
        or o.remaining >= 1
    ):
        return reset
    rate = o.limit / 60.0 if o.limit is not None and o.limit >= 1 else check.rate
    return max(0.0, reset - held * 60.0 + 1.0 / rate) if rate > 0 else reset


def _signal_from_headers(headers: Mapping[str, str], now: datetime) -> LimitSignal:
    # Imported here: Read (classify) is a sibling stage, loaded only when used.
    classify = importlib.import_module("rateloop.classify").classify
    return cast(LimitSignal, classify(200, headers, b"", now=now))
