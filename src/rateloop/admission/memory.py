"""The in-process backend: the arithmetic of :mod:`gcra` under one lock.

Safe across threads and asyncio tasks of one process: every operation runs
start to finish under a :class:`threading.Lock` and never awaits, so it is as
atomic as the Redis script.  Buckets, pauses and leases use the injected
clock's monotonic time; fixed day windows use its wall time (UTC), because a
day resets at a time of day.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from rateloop._clock import Clock, system_clock
from rateloop.admission.gcra import (
    AIMD,
    LEASE_POLL_SECONDS,
    Bucket,
    bucket_wait,
    day_window,
    drained,
    effective_factor,
    lowered_factor,
)
from rateloop.admission.plan import (
    AdmitOp,
    AdmitResult,
    Check,
    CheckKind,
    ObserveOp,
    PauseOp,
    PauseResult,
    SettleOp,
)

__all__ = ["MemoryBackend"]


@dataclass(slots=True)
class _Day:
    count: float = 0.0
    index: int = -(2**62)
    blocked_until: float = 0.0


@dataclass(slots=True)
class _Scope:
    buckets: dict[str, Bucket] = field(default_factory=dict)
    days: dict[str, _Day] = field(default_factory=dict)
    leases: dict[str, float] = field(default_factory=dict)
    paused_until: float = -math.inf
    pause_reason: str = ""
    factor: float = 1.0
    factor_since: float = 0.0
    last_decrease: float = -math.inf

    def factor_at(self, now: float, aimd: AIMD) -> float:
        return effective_factor(self.factor, self.factor_since, now, aimd)


class MemoryBackend:
    """Limiter state in this process only (``memory://``)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or system_clock
        self._lock = threading.Lock()
        self._scopes: dict[str, _Scope] = {}

    url = "memory://"

    def __repr__(self) -> str:
        return f"MemoryBackend(scopes={len(self._scopes)})"

    # -- the Backend protocol -------------------------------------------------

    def execute(self, op: object) -> object:
        now = self._clock.monotonic()
        wall = self._clock.now().timestamp()
        with self._lock:
            if isinstance(op, AdmitOp):
                return self._admit(op, now, wall)
            if isinstance(op, SettleOp):
                return self._settle(op, now)
            if isinstance(op, PauseOp):
                return self._pause(op, now)
            if isinstance(op, ObserveOp):
                return self._observe(op, now, wall)
        raise TypeError(f"MemoryBackend cannot execute {op!r}")

    async def aexecute(self, op: object) -> object:
        return self.execute(op)

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
        return check.rate * (state.factor_at(now, aimd) if check.scaled else 1.0)

    def _admit(self, op: AdmitOp, now: float, wall: float) -> AdmitResult:
        for check in op.checks:
            if check.never_fits:
                return AdmitResult(
                    granted=False,
                    now=now,
                    scope=check.scope,
                    dimension=check.dimension,
                    never_fits=True,
                )
        wait = 0.0
        result = AdmitResult(granted=True, now=now)
        for key in op.scopes:
            state = self._scopes.get(key)
            if state is not None and state.paused_until - now > wait:
                wait = state.paused_until - now
                result = AdmitResult(
                    granted=False, now=now, wait=wait, scope=key, paused_reason=state.pause_reason
                )
        for check in op.checks:
            w = self._wait(check, self._scope(check.scope), now, wall, op.aimd)
            if w > wait:
                wait = w
                result = AdmitResult(
                    granted=False, now=now, wait=w, scope=check.scope, dimension=check.dimension
                )
        if not result.granted:
            return result
        for check in op.checks:
            self._take(check, self._scope(check.scope), now, wall, op)
        return result

    def _wait(self, check: Check, state: _Scope, now: float, wall: float, aimd: AIMD) -> float:
        name = check.dimension.value
        if check.kind is CheckKind.BUCKET:
            bucket = state.buckets.setdefault(name, Bucket())
            rate = self._rate(check, state, now, aimd)
            level = drained(bucket.level, bucket.ts, now, rate)
            wait = bucket_wait(level, check.amount, check.allowed, rate)
            return max(wait, bucket.blocked_until - now)
        if check.kind is CheckKind.DAY:
            day = state.days.setdefault(name, _Day())
            index, end = day_window(wall, check.offset)
            count = day.count if day.index == index else 0.0
            wait = end - wall if count + check.amount > check.allowed else 0.0
            return max(wait, day.blocked_until - now)
        live = {lid: exp for lid, exp in state.leases.items() if exp > now}
        state.leases = live
        if len(live) + 1 > check.allowed:
            return max(min(min(live.values()) - now, LEASE_POLL_SECONDS), 1e-6)
        return 0.0

    def _take(self, check: Check, state: _Scope, now: float, wall: float, op: AdmitOp) -> None:
        name = check.dimension.value
        if check.kind is CheckKind.BUCKET:
            bucket = state.buckets[name]
            rate = self._rate(check, state, now, op.aimd)
            bucket.level = drained(bucket.level, bucket.ts, now, rate) + check.amount
            bucket.ts = now
        elif check.kind is CheckKind.DAY:
            day = state.days[name]
            index, _ = day_window(wall, check.offset)
            day.count = (day.count if day.index == index else 0.0) + check.amount
            day.index = index
        elif op.lease_id is not None:
            state.leases[op.lease_id] = now + check.ttl

    def _settle(self, op: SettleOp, now: float) -> float:
        for adj in op.adjustments:
            check = adj.check
            if check.kind is not CheckKind.BUCKET:
                continue
            state = self._scope(check.scope)
            bucket = state.buckets.setdefault(check.dimension.value, Bucket())
            rate = self._rate(check, state, now, op.aimd)
            bucket.level = max(0.0, drained(bucket.level, bucket.ts, now, rate) + adj.delta)
            bucket.ts = now
        if op.lease_scope is not None and op.lease_id is not None:
            self._scope(op.lease_scope).leases.pop(op.lease_id, None)
        return now

    def _pause(self, op: PauseOp, now: float) -> PauseResult:
        state = self._scope(op.scope)
        until = now + op.seconds
        if until > state.paused_until:
            state.paused_until = until
            state.pause_reason = op.reason
        return PauseResult(now=now, until=state.paused_until)

    def _observe(self, op: ObserveOp, now: float, wall: float) -> float:
        state = self._scope(op.scope)
        if op.lower:
            factor, lowered = lowered_factor(
                state.factor, state.factor_since, state.last_decrease, now, op.aimd
            )
            if lowered:
                state.factor, state.factor_since, state.last_decrease = factor, now, now
        for t in op.tightenings:
            check = t.check
            name = check.dimension.value
            block = (
                now + t.reset_after
                if t.remaining is not None and t.remaining < 1 and t.reset_after
                else -math.inf
            )
            if check.kind is CheckKind.BUCKET:
                bucket = state.buckets.setdefault(name, Bucket())
                rate = self._rate(check, state, now, op.aimd)
                level = drained(bucket.level, bucket.ts, now, rate)
                if t.remaining is not None:
                    level = max(level, check.capacity - t.remaining)
                bucket.level, bucket.ts = level, now
                bucket.blocked_until = max(bucket.blocked_until, block)
            elif check.kind is CheckKind.DAY:
                day = state.days.setdefault(name, _Day())
                index, _ = day_window(wall, check.offset)
                count = day.count if day.index == index else 0.0
                if t.remaining is not None:
                    count = max(count, check.capacity - t.remaining)
                day.count, day.index = count, index
                day.blocked_until = max(day.blocked_until, block)
        return state.factor_at(now, op.aimd)
