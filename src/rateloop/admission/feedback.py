"""What the provider said: the flows behind ``Limiter.observe`` and ``Limiter.pause``.

How it works.  :meth:`Feedback.observe_flow` resynchronises the governing
scope's buckets with the provider's ``remaining``/``reset`` headers, learns
limits and bursts (into :class:`~rateloop.admission.known.KnownLimits`),
records refusals (in :class:`~rateloop.admission.runner.Refusals`, and on the
backend, so that calls booked before them are admitted again) and applies the
AIMD decrease; :meth:`Feedback.pause_flow` pauses a scope.  Headers are read
by Read (:func:`rateloop.classify.classify`).  The flows yield steps that the
:class:`~rateloop.admission.runner.BackendRunner` performs.

Depends on: KnownLimits, Refusals, the clock and the random source -- never
on the limiter.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime

from rateloop._clock import Clock
from rateloop.admission.gcra import AIMD
from rateloop.admission.known import KnownLimits
from rateloop.admission.learning import path, tightened
from rateloop.admission.plan import Check, CheckKind, ObserveOp, PauseOp, Tightening, build_checks
from rateloop.admission.refusals import Refusals
from rateloop.admission.runner import Do, Flow
from rateloop.admission.spec import LimitSpec
from rateloop.admission.subscription import subscription_block
from rateloop.classify import classify
from rateloop.signal import Dimension, Kind, LimitSignal, Observed, clamp_wait

__all__ = ["Feedback"]

#: Signals that say the provider refused a call for capacity (recorded as a refusal).
_REFUSALS = frozenset({Kind.TEMPORARY, Kind.PERIOD_QUOTA})
_NO_SPEC = LimitSpec()


class Feedback:
    """Learns from what the provider said of a scope (headers, signals) and pauses scopes."""

    def __init__(
        self,
        known: KnownLimits,
        refusals: Refusals,
        *,
        clock: Clock,
        rng: random.Random,
        aimd: AIMD,
    ) -> None:
        self._known = known
        self._refusals = refusals
        self._clock = clock
        self._rng = rng
        self.aimd = aimd

    def pause_flow(self, scope: str, until: datetime | float, reason: str) -> Flow[None]:
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
            done = yield Do(PauseOp(scope=scope, seconds=wait, reason=str(reason)))
            self._refusals.note(((scope, done[0].until),), done[2])


    def observe_flow(self, scope: str, source: LimitSignal | Mapping[str, str]) -> Flow[None]:
        """Resynchronise the governing scope's state with what the provider said.

        Header truth over guesswork: ``remaining``/``reset`` headers set the
        state of the dimensions they name, on every observed response.  The
        AIMD decrease applies only to a 429 that nothing explains -- no
        header told the state of a limit we govern, and no limit was just
        learned from it (the 429 that taught a limit is not a reason to go
        slower than that limit).

        A refusal binds the scope the provider limits (:func:`_bound_scope`):
        the observed one unless the signal names a wider one.  It never blocks
        or voids the bookings of limits broader than that scope -- a project's
        429 leaves its model's other projects their capacity -- so when only a
        broader scope has limits, the bound scope is paused instead.
        """
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"scope must be a non-empty string, got {scope!r}")
        block: float | None = None
        if isinstance(source, LimitSignal):
            signal = source
        else:
            signal = _signal_from_headers(source, self._clock.now())
            block = subscription_block(source, self._clock.now())
        store = self._known.learned.learn(scope, signal)
        learned = store is not None
        if learned:
            self._known.forget_plans()
            if self._known.shared:
                yield Do(store)
        # A limit the headers state lower than configured binds on the scope they
        # describe -- the observed one, when it is configured -- never on a broader
        # one (a model's total over several projects or keys, a provider-wide scope).
        if self._known.learned.learn_stated(scope, signal):
            self._known.warn_stated(scope)
            self._known.forget_plans()
        target = self._known.governing(scope)
        if target is not None and (burst_op := self._known.learned.learn_burst(target, signal)):
            # The provider's bucket is short (or shorter than known): the target's
            # buckets take its capacity -- their levels stay, so a larger capacity
            # credits the difference, the headroom the provider has on top.
            if (self._known.configured(target) or _NO_SPEC).burst is None:
                self._known.forget_plans()
            if self._known.shared:
                yield Do(burst_op)
        spec = self._known.limits_for(target) if target is not None else None
        by_dimension: dict[Dimension, Check] = {}
        if target is not None and spec is not None:
            for check in build_checks(target, spec, profile=self._known.profile_of(scope)):
                by_dimension[check.dimension] = check
        held = self._known.learned.burst(target) if target is not None else None
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
            tightenings = self._known.stretch_blocks(
                target, signal, tightenings, now=self._clock.monotonic(), draw=self._rng.random
            )
        lower = signal.kind is Kind.TEMPORARY and not tightenings and not learned
        # A refusal: the scope it binds records it, so that calls booked before it (in
        # this process and, through the shared backend, in others) are admitted again.
        refused = signal.kind in _REFUSALS
        bound = _bound_scope(scope, signal) if refused else scope
        pause = refused and bound != scope  # a wider scope the signal names
        if refused and target is not None and _depth(target) < _depth(bound):
            # The limits in force are broader (the model's) than the scope the
            # refusal binds (the project): its blocks describe the project's own
            # limit, not the model's total, so the model's buckets and bookings are
            # left to the project's siblings (a 429 nothing explains still lowers
            # the model's rate for a few seconds, as AIMD does), and the refused
            # project is paused until the longest block it states.
            pause, tightenings, refused = True, (), False
        if target is not None and (tightenings or lower or refused):
            op = ObserveOp(
                scope=target, tightenings=tightenings, lower=lower, aimd=self.aimd, refused=refused
            )
            done = yield Do(op)
            if refused:
                self._refusals.note(((target, done[0][1]),), done[2])
        if pause:
            # Bound beyond the target's state: the project above, or a wider scope
            # the signal names (the model's or organisation's own limit), which is
            # paused as a whole, every project of it.
            wait = _stated_block(signal)
            if wait > 0:
                yield from self.pause_flow(bound, wait, f"{signal.kind.value} on {bound}")
        if block is not None:
            yield Do(PauseOp(scope=scope, seconds=block, reason="subscription window exhausted"))


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


def _bound_scope(scope: str, signal: LimitSignal) -> str:
    """The scope a refusal observed on ``scope`` binds: the one the provider says it limits.

    ``scope`` itself (the route's provider scope, ``provider:model[:project]``)
    unless the signal names a broader scope on its path (``signal.scope``, say
    ``"openai:gpt-4.1"`` for an organisation-wide limit of the model): only a
    signal that says so binds the model's other projects.  A scope above
    ``provider:model`` (``"openai"``) binds ``provider:model``: the widest
    scope a route belongs to, so the widest a pause can hold.
    """
    named = signal.scope
    if not named or named not in path(scope):
        return scope
    return named if _depth(named) >= 1 else ":".join(scope.split(":", 2)[:2])


def _depth(scope: str) -> int:
    return scope.count(":")


def _stated_block(signal: LimitSignal) -> float:
    """How long a refusal says its scope has nothing: the server's ``retry_after`` or
    its longest stated block (a dimension with nothing ``remaining`` until its reset)."""
    blocks = [o.reset_after for o in signal.observed
              if o.remaining is not None and o.remaining < 1 and o.reset_after]
    return max([*blocks, signal.retry_after or 0.0])


def _signal_from_headers(headers: Mapping[str, str], now: datetime) -> LimitSignal:
    return classify(200, headers, b"", now=now)
