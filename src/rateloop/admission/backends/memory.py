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
from dataclasses import dataclass, field
from typing import Any

from rateloop._clock import Clock, system_clock
from rateloop.admission.backends.protocol import Backend
from rateloop.admission.backends.registry import register_backend
from rateloop.admission.gcra import (
    AIMD,
    LEASE_POLL_SECONDS,
    Bucket,
    bucket_fit,
    day_window,
    drained,
    effective_factor,
    lowered_factor,
)
from rateloop.admission.history import MemoryHistory
from rateloop.admission.learning import LearnedOp, LearnOp
from rateloop.admission.plan import (
    AdmitOp,
    AdmitResult,
    Check,
    CheckKind,
    ObserveOp,
    PauseOp,
    PauseResult,
    Refused,
    SettleOp,
)
from rateloop.signal import Dimension

__all__ = ["MemoryBackend"]

_BUCKET = CheckKind.BUCKET
_DAY = CheckKind.DAY

# The history's field names of each dimension (``admit.lua``'s): units used, the limit in
# force, the count held.  Built once: an enum's ``.value`` is a Python-level descriptor.
_USED = {d: "u:" + d.value for d in Dimension}
_LIMIT = {d: "L:" + d.value for d in Dimension}
_COUNT = {d: "c:" + d.value for d in Dimension}
_new_tuple = tuple.__new__


@dataclass(slots=True)
class _Day:
    count: float = 0.0
    index: int = -(2**62)
    blocked_until: float = 0.0


@dataclass(slots=True)
class _Scope:
    buckets: dict[Dimension, Bucket] = field(default_factory=dict)
    days: dict[Dimension, _Day] = field(default_factory=dict)
    leases: dict[str, float] = field(default_factory=dict)
    paused_until: float = -math.inf
    pause_reason: str = ""
    factor: float = 1.0
    factor_since: float = 0.0
    last_decrease: float = -math.inf
    # A refusal (429 observed, pause) said the provider has nothing before this time:
    # a call booked to start earlier must not go (``Reservation.stale``).
    refused_until: float = -math.inf

    def factor_at(self, now: float, aimd: AIMD) -> float:
        factor = effective_factor(self.factor, self.factor_since, now, aimd)
        if factor >= 1.0:
            self.factor = 1.0  # fully recovered: back on the fast path
        return factor


def _lease_wait(state: _Scope, now: float, allowed: float) -> float:
    """Seconds until one more lease fits ``allowed`` slots (0: it fits now).

    Expired leases are dropped only when the held ones (live or not) fill
    the slots: while they do not, the call fits whatever has expired, so the
    common case costs no scan.  The dict thus never holds more than
    ``allowed`` leases plus those granted since the last scan.
    """
    leases = state.leases
    if len(leases) + 1 <= allowed:
        return 0.0
    live = {lid: exp for lid, exp in leases.items() if exp > now}
    state.leases = live
    if len(live) + 1 <= allowed:
        return 0.0
    return max(min(min(live.values()) - now, LEASE_POLL_SECONDS), 1e-6)


def _apply_booked(
    staged: list[tuple[Check, _Scope, Any, float, float]],
    amounts: tuple[float, ...],
    now: float,
    starts_in: float,
    lease_id: str | None,
) -> None:
    """Charge a booked call at its start: each bucket holds its level *at* the start.

    A bucket's ``ts`` then lies ahead (the latest start booked on it): it does
    not drain before it, later calls start after it, and every bucket sees its
    charges in the order of their starts -- an ordinary bucket over start
    times, so the bound of :mod:`gcra` holds for the units starting in any
    window.  A booking has no day window or lease wait (those are never
    booked), so those are applied as for a call that starts now.
    """
    at = now + starts_in
    for (check, state, slot, value, extra), amount in zip(staged, amounts, strict=True):
        if slot is None:
            if lease_id is not None:
                state.leases[lease_id] = now + check.ttl
        elif type(slot) is Bucket:
            base = max(slot.ts, now)  # ``value - amount`` is the level at ``base``
            slot.level = max(0.0, value - amount - (at - base) * extra) + amount
            slot.ts = at
        else:
            slot.count = value
            slot.index = int(extra)


def _record(
    history: MemoryHistory,
    wall: float,
    staged: list[tuple[Check, _Scope, Any, float, float]],
    amounts: tuple[float, ...],
    allowances: tuple[float, ...],
) -> None:
    """One admission in the history of each scope it was checked in (see ``admit.lua``)."""
    with history.lock:
        records: dict[str, dict[str, float]] = {}
        for (check, state, slot, value, extra), amount, allowed in zip(  # noqa: B905
            staged, amounts, allowances
        ):
            fields = records.get(check.scope)
            if fields is None:
                fields = records[check.scope] = history.record(check.scope, wall)
                fields["a"] = fields.get("a", 0.0) + 1
            dimension = check.dimension
            if slot is None:  # a lease: the leases held now, of the slots
                fields[_COUNT[dimension]] = float(len(state.leases))
                fields[_LIMIT[dimension]] = allowed
                continue
            used = _USED[dimension]
            fields[used] = fields.get(used, 0.0) + amount
            if type(slot) is Bucket:  # per minute, at the rate in force (AIMD included)
                fields[_LIMIT[dimension]] = extra * 60.0
            else:
                fields[_COUNT[dimension]] = value
                fields[_LIMIT[dimension]] = allowed


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
