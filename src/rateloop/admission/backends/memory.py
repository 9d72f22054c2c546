"""The in-process backend: the arithmetic of :mod:`gcra` under one lock.

Safe across threads and asyncio tasks of one process: every operation runs
start to finish under a :class:`threading.Lock` and never awaits, so it is as
atomic as the Redis script.  Buckets, pauses and leases use the injected
clock's monotonic time; fixed day windows use its wall time (UTC), because a
day resets at a time of day.  Importing this module registers ``memory://``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

from rateloop._clock import Clock, system_clock
from rateloop.admission.backends._memstate import USED as _USED
from rateloop.admission.backends._memstate import Day as _Day
from rateloop.admission.backends._memstate import ScopeState as _Scope
from rateloop.admission.backends._memstate import apply_booked as _apply_booked
from rateloop.admission.backends._memstate import lease_wait as _lease_wait
from rateloop.admission.backends._memstate import record as _record
from rateloop.admission.backends.protocol import Backend
from rateloop.admission.backends.registry import register_backend
from rateloop.admission.gcra import (
    AIMD,
    Bucket,
    bucket_fit,
    day_window,
    drained,
    lease_calls,
    lowered_factor,
    returnable,
)
from rateloop.admission.history import MemoryHistory
from rateloop.admission.learning import LearnedOp, LearnOp
from rateloop.admission.plan import (
    AdmitOp,
    AdmitResult,
    BorrowOp,
    Check,
    CheckKind,
    ObserveOp,
    PauseOp,
    PauseResult,
    Refused,
    ReturnOp,
    SettleOp,
)
from rateloop.signal import Dimension

__all__ = ["MemoryBackend"]

_BUCKET = CheckKind.BUCKET
_DAY = CheckKind.DAY

_new_tuple = tuple.__new__


class MemoryBackend:
    """Limiter state in this process only (``memory://``).

    ``history`` (on by default) keeps each scope's last 24 h minute by minute
    (:attr:`history`, a :class:`~rateloop.admission.history.MemoryHistory`).
    """

    def __init__(self, clock: Clock | None = None, *, history: bool = True) -> None:
        self._clock = clock or system_clock
        self.history: MemoryHistory | None = MemoryHistory() if history else None
        self._monotonic = self._clock.monotonic  # bound once: read on every operation
        self._lock = threading.Lock()
        self._scopes: dict[str, _Scope] = {}
        self._learned: dict[str, tuple[dict[str, float], float]] = {}
        self._start_full = False
        self._ahead: dict[str, float] = {}

    url = "memory://"

    @property
    def clock(self) -> Clock:
        """The clock this backend's state runs on."""
        return self._clock

    def __repr__(self) -> str:
        return f"MemoryBackend(scopes={len(self._scopes)})"

    # -- the Backend protocol -------------------------------------------------

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        now = self._monotonic()
        lock = self._lock
        # acquire/release rather than ``with``: half the cost on the hot path, same guarantee.
        lock.acquire()
        try:
            if type(op) is AdmitOp:
                return self._admit(op, now)
            if type(op) is SettleOp:
                return self._settle(op, now)
            if type(op) is BorrowOp:
                return self._borrow(op, now)
            if type(op) is ReturnOp:
                return self._give_back(op, now)
            if isinstance(op, PauseOp):
                return self._pause(op, now)
            if isinstance(op, ObserveOp):
                return self._observe(op, now, self._clock.now().timestamp())
            if isinstance(op, LearnOp):
                held = self._learned.get(op.scope)
                values = dict(held[0]) if held is not None and held[1] > now else {}
                values.update(op.limits)
                self._learned[op.scope] = (values, now + op.ttl)
                return 1
            if isinstance(op, LearnedOp):
                found = {s: self._learned.get(s) for s in op.scopes}
                return {s: dict(v[0]) for s, v in found.items() if v is not None and v[1] > now}
        finally:
            lock.release()
        raise TypeError(f"MemoryBackend cannot execute {op!r}")

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        return self.execute(op)

    def restart_full(self, ahead: Mapping[str, float] | None = None) -> None:
        """Forget every bucket and start each again *full* (leases and pauses are kept).

        For the limiter's local fallback: a process that falls back does not
        know what the others admitted just before, so it assumes its share
        was just used and admits at its share of the rate, not a burst on
        top of what the shared backend already let through.  ``ahead``: per
        scope, the latest start this process booked on the shared backend
        (this clock's monotonic time): those calls are still to start, so the
        scope's buckets are full *then* -- the local grants queue behind them.
        """
        with self._lock:
            for state in self._scopes.values():
                state.buckets.clear()
            self._start_full = True
            self._ahead = dict(ahead or {})

    def _wall(self, wall: float | None) -> float:
        return wall if wall is not None else self._clock.now().timestamp()

    def _new_bucket(self, check: Check, now: float) -> Bucket:
        if self._start_full:
            return Bucket(level=check.capacity, ts=max(now, self._ahead.get(check.scope, now)))
        return Bucket()

    def in_use(self, check: Check) -> float:
        """The units of ``check``'s bucket not drained yet, bookings ahead included.

        What this backend granted that still counts against the limit: when
        the limiter returns from its local fallback these are booked on the
        shared backend (:func:`rateloop.admission.local.carry_ops`).
        """
        with self._lock:
            state = self._scopes.get(check.scope)
            bucket = state.buckets.get(check.dimension) if state is not None else None
            if bucket is None:
                return 0.0
            now = self._monotonic()
            if bucket.ts > now:  # booked ahead: its level at the latest start, and the starts
                return bucket.level + (bucket.ts - now) * check.rate
            return drained(bucket.level, bucket.ts, now, check.rate)

    def close(self) -> None:
        """Nothing to close; present for the protocol."""

    async def aclose(self) -> None:
        """Nothing to close; present for the protocol."""

    # -- operations -------------------------------------------------------------

    def _scope(self, key: str) -> _Scope:
        state = self._scopes.get(key)
        if state is None:
            state = self._scopes[key] = _Scope()
        return state

    def _rate(self, check: Check, state: _Scope, now: float, aimd: AIMD) -> float:
        if not check.scaled or state.factor >= 1.0:
            return check.rate
        return check.rate * state.factor_at(now, aimd)

    def _admit(self, op: AdmitOp, now: float) -> AdmitResult:
        """Compute every wait first; apply only when all are zero -- or booked.  (The hot path.)

        A booking (``op.book``) applies the same writes when only bucket
        levels make the call wait, at most ``book`` seconds: each bucket's
        level then exceeds the allowance by exactly what drains before the
        start, so the call starts on a level within it and later calls queue
        behind it, first come first served.

        Written for speed: locals instead of repeated attribute loads, the
        fused :func:`bucket_fit`, and the granted result built with
        ``tuple.__new__`` (a NamedTuple's own constructor is Python code).
        """
        plan, amounts, allowances, lease_id, aimd, book = op  # one unpack, not six loads
        scopes = self._scopes
        wait = 0.0
        hard = 0.0  # the longest wait a booking cannot cover (pause, day, lease, block)
        blame: tuple[str, Dimension | None, str | None] | None = None
        refused: Refused = ()  # the refusals in force, each in the scope it was recorded in
        for key in plan.scopes:
            state = scopes.get(key)
            if state is not None:
                if state.paused_until - now > wait:
                    wait = hard = state.paused_until - now
                    blame = (key, None, state.pause_reason)
                if state.refused_until > now:
                    refused += ((key, state.refused_until),)
        wall: float | None = None
        # (check, state, slot, new value, rate of a bucket | index of a day window)
        staged: list[tuple[Check, _Scope, Any, float, float]] = []
        # Parallel tuples of one plan (no ``strict=``: it costs on the hot path).
        for check, amount, allowed in zip(plan.checks, amounts, allowances):  # noqa: B905
            if amount > allowed:
                return AdmitResult(
                    granted=False,
                    now=now,
                    scope=check.scope,
                    dimension=check.dimension,
                    never_fits=True,
                    refused=refused,
                )
            state = scopes.get(check.scope) or self._scope(check.scope)
            kind = check.kind
            if kind is _BUCKET:
                bucket = state.buckets.get(check.dimension)
                if bucket is None:
                    bucket = state.buckets[check.dimension] = self._new_bucket(check, now)
                rate = check.rate
                if state.factor < 1.0 and check.scaled:
                    rate *= state.factor_at(now, aimd)
                if bucket.ts > now:
                    # Booked ahead: charged at its start, so a call starts after it.
                    level = bucket.level
                    w = bucket.ts - now + max(0.0, level + amount - allowed) / rate
                else:
                    level, w = bucket_fit(bucket.level, bucket.ts, now, rate, amount, allowed)
                if bucket.blocked_until > now:
                    hard = max(hard, bucket.blocked_until - now)
                    w = max(w, hard)
                staged.append((check, state, bucket, level + amount, rate))
            elif kind is _DAY:
                day = state.days.get(check.dimension)
                if day is None:
                    day = state.days[check.dimension] = _Day()
                if wall is None:
                    wall = self._clock.now().timestamp()
                index, end = day_window(wall, check.offset)
                count = day.count if day.index == index else 0.0
                w = end - wall if count + amount > allowed else 0.0
                w = max(w, day.blocked_until - now)
                hard = max(hard, w)
                staged.append((check, state, day, count + amount, index))
            else:
                w = _lease_wait(state, now, allowed)
                hard = max(hard, w)
                staged.append((check, state, None, 0.0, 0))
            if w > wait:
                wait = w
                blame = (check.scope, check.dimension, None)
        if blame is not None and (hard > 0.0 or wait > book):
            scope, dimension, reason = blame
            return AdmitResult(
                granted=False,
                now=now,
                wait=wait,
                scope=scope,
                dimension=dimension,
                paused_reason=reason,
                refused=refused,
            )
        history = self.history
        if blame is not None:  # only bucket levels make it wait, within ``book``: booked
            _apply_booked(staged, amounts, now, wait, lease_id)
            if history is not None:
                _record(history, self._wall(wall), staged, amounts, allowances)
            booked = (True, now, 0.0, None, None, False, None, wait, refused)
            return _new_tuple(AdmitResult, booked)
        for check, state, slot, value, extra in staged:
            if slot is None:
                if lease_id is not None:
                    state.leases[lease_id] = now + check.ttl
            elif type(slot) is Bucket:
                slot.level = value
                slot.ts = now
            else:
                slot.count = value
                slot.index = int(extra)
        if history is not None:
            _record(history, self._wall(wall), staged, amounts, allowances)
        return _new_tuple(AdmitResult, (True, now, 0.0, None, None, False, None, 0.0, refused))

    def _settle(self, op: SettleOp, now: float) -> tuple[float, Refused]:
        scopes = self._scopes
        since = max(now, op.starts_at)
        refused: Refused = ()
        for check, delta in zip(op.checks, op.deltas, strict=True):
            state = scopes.get(check.scope) or self._scope(check.scope)
            if state.refused_until > now and all(s != check.scope for s, _ in refused):
                refused += ((check.scope, state.refused_until),)
            bucket = state.buckets.get(check.dimension)
            if bucket is None:
                bucket = state.buckets[check.dimension] = Bucket()
            rate = self._rate(check, state, now, op.aimd)
            if bucket.ts > now:
                # Booked ahead: the state is the level at its last start.  A refund
                # lowers that level by at most what would not have drained between
                # the reservation's own start (or now) and then -- the bucket may
                # empty in between, which the state no longer shows.
                change = delta
                if change < 0.0:
                    change = min(0.0, change + max(0.0, bucket.ts - since) * rate)
                bucket.level = max(0.0, bucket.level + change)
            else:
                bucket.level = max(0.0, drained(bucket.level, bucket.ts, now, rate) + delta)
                bucket.ts = now
        history = self.history
        if history is not None and any(op.deltas):
            wall = self._clock.now().timestamp()
            for check, delta in zip(op.checks, op.deltas, strict=True):
                if delta:
                    history.add(check.scope, wall, {_USED[check.dimension]: delta})
        lease_id = op.lease_id
        if lease_id is not None:
            for lease_scope in op.plan.lease_scopes:  # held in every scope with a limit
                self._scope(lease_scope).leases.pop(lease_id, None)
        return now, refused

    def _borrow(self, op: BorrowOp, now: float) -> tuple[AdmitResult, float]:
        """``op.op``, and when it goes now up to ``op.most`` more of its amounts (a lease).

        ``k`` is decided on the levels now (:func:`lease_calls` per bucket); the
        call and its ``k`` more are then one admission, which those levels
        admit.  Otherwise -- a bucket booked ahead or blocked, a pause, a check
        that is no bucket -- the call is admitted alone, as in ``admit.lua``.
        """
        inner = op.op
        k = op.most
        for check, amount, allowed in zip(  # noqa: B905 - parallel tuples of one plan
            inner.plan.checks, inner.amounts, inner.allowed
        ):
            state = self._scopes.get(check.scope)
            bucket = state.buckets.get(check.dimension) if state is not None else None
            if check.kind is not _BUCKET or (bucket is not None and bucket.ts > now):
                k = 0.0
                break
            level = 0.0
            if state is not None and bucket is not None:
                rate = self._rate(check, state, now, inner.aimd)
                level = drained(bucket.level, bucket.ts, now, rate)
            k = min(k, lease_calls(level + amount, allowed, amount))
        if k >= 1.0:
            more = tuple(a * (1.0 + k) for a in inner.amounts)
            result = self._admit(AdmitOp(inner.plan, more, inner.allowed, None, inner.aimd), now)
            if result.granted:
                return result, k
        return self._admit(inner, now), 0.0

    def _give_back(self, op: ReturnOp, now: float) -> tuple[float, tuple[float, ...]]:
        """A lease's unused units back, as far as they cannot have drained (:func:`returnable`).

        Answers what each bucket's level really went down by.
        """
        given: list[float] = []
        for check, borrowed, left in zip(op.checks, op.borrowed, op.left, strict=True):
            state = self._scope(check.scope)
            bucket = state.buckets.get(check.dimension)
            if bucket is None:
                given.append(0.0)
                continue
            at = max(bucket.ts, now)  # booked ahead: its level at its last start
            level = drained(bucket.level, bucket.ts, at, self._rate(check, state, now, op.aimd))
            back = min(level, returnable(borrowed, left, check.rate, op.since, at))
            bucket.level, bucket.ts = level - back, at
            given.append(back)
            if back and self.history is not None:
                wall = self._clock.now().timestamp()
                self.history.add(check.scope, wall, {_USED[check.dimension]: -back})
        return now, tuple(given)

    def _pause(self, op: PauseOp, now: float) -> PauseResult:
        state = self._scope(op.scope)
        until = now + op.seconds
        state.refused_until = max(state.refused_until, until)
        if until > state.paused_until:
            state.paused_until = until
            state.pause_reason = op.reason
            if self.history is not None:
                wall = self._clock.now().timestamp()
                self.history.paused(op.scope, wall, wall + op.seconds)
        return PauseResult(now=now, until=state.paused_until)

    def _observe(self, op: ObserveOp, now: float, wall: float) -> tuple[float, float]:
        state = self._scope(op.scope)
        refused_until = now  # a refusal: nothing before its blocks' ends (at least now)
        if op.lower:
            factor, lowered = lowered_factor(
                state.factor, state.factor_since, state.last_decrease, now, op.aimd
            )
            if lowered:
                state.factor, state.factor_since, state.last_decrease = factor, now, now
        for t in op.tightenings:
            check = t.check
            name = check.dimension
            block = (
                now + t.reset_after
                if t.remaining is not None and t.remaining < 1 and t.reset_after
                else -math.inf
            )
            refused_until = max(refused_until, block)
            if check.kind is CheckKind.BUCKET:
                bucket = state.buckets.setdefault(name, Bucket())
                rate = self._rate(check, state, now, op.aimd)
                at = max(bucket.ts, now)  # a bucket booked ahead changes at its last start
                level = drained(bucket.level, bucket.ts, at, rate)
                if t.remaining is not None:  # said of now: drained until ``at``
                    level = max(level, check.capacity - t.remaining - (at - now) * rate)
                bucket.level, bucket.ts = level, at
                bucket.blocked_until = max(bucket.blocked_until, block)
            elif check.kind is CheckKind.DAY:
                day = state.days.setdefault(name, _Day())
                index, _ = day_window(wall, check.offset)
                count = day.count if day.index == index else 0.0
                if t.remaining is not None:
                    count = max(count, check.capacity - t.remaining)
                day.count, day.index = count, index
                day.blocked_until = max(day.blocked_until, block)
        if op.refused and refused_until > state.refused_until:
            state.refused_until = refused_until
        return state.factor_at(now, op.aimd), state.refused_until


def _memory(url: str, *, clock: Clock, prefix: str, **options: Any) -> Backend:
    history = options.pop("history", True)
    if options:
        raise TypeError(f"memory:// takes only the option history, got {sorted(options)}")
    if not isinstance(history, bool):
        raise TypeError(f"history must be True or False, got {history!r}")
    return MemoryBackend(clock, history=history)


register_backend("memory", _memory)
