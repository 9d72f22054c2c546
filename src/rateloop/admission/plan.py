"""What a backend is asked to do: admission checks and operations, as plain values.

The :class:`~rateloop.admission.limiter.Limiter` turns a route, a cost, a
priority and the configured :class:`LimitSpec` of every scope into a tuple of
:class:`Check` values -- one per limited dimension of every scope -- and
wraps them in an operation (:class:`AdmitOp`, :class:`SettleOp`,
:class:`PauseOp`, :class:`ObserveOp`).  A backend executes one operation
atomically, in one step: the memory backend under a lock, Redis in one Lua
script.  Because the plan is computed here, once, the backends only do the
arithmetic of :mod:`rateloop.admission.gcra`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from rateloop.admission.gcra import AIMD, DAY
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost
from rateloop.signal import Dimension

__all__ = [
    "Adjustment",
    "AdmitOp",
    "AdmitResult",
    "Check",
    "CheckKind",
    "ObserveOp",
    "PauseOp",
    "PauseResult",
    "Priority",
    "SettleOp",
    "Tightening",
    "build_checks",
    "class_allowance",
]


class Priority(StrEnum):
    """Admission classes, highest first.

    A lower class is admitted only while ``reserve`` of each capacity stays
    free for the classes above it: ``scheduled`` must leave ``reserve``,
    ``background`` ``2 × reserve``.
    """

    INTERACTIVE = "interactive"
    SCHEDULED = "scheduled"
    BACKGROUND = "background"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    @classmethod
    def parse(cls, value: str | Priority) -> Priority:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown priority {value!r} (allowed: {allowed})") from None


_RANKS = {Priority.INTERACTIVE: 0, Priority.SCHEDULED: 1, Priority.BACKGROUND: 2}


class CheckKind(StrEnum):
    """How a dimension is limited: a refilled bucket, a fixed day window, leases."""

    BUCKET = "b"
    DAY = "d"
    LEASE = "l"


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One limited dimension of one scope, for one call.

    ``capacity`` is the bucket's burst (units), the day window's limit or the
    number of lease slots; ``allowed`` is how far this call's priority class
    may fill it -- never less than the call's own ``amount`` when that fits
    the capacity (see :func:`class_allowance`), so ``amount > allowed`` exactly
    when the cost exceeds the capacity itself and can never fit.  ``scaled``
    buckets follow the scope's AIMD factor.
    """

    scope: str
    dimension: Dimension
    kind: CheckKind
    capacity: float
    allowed: float
    amount: float = 0.0
    rate: float = 0.0
    scaled: bool = False
    offset: float = 0.0
    ttl: float = 0.0

    @property
    def never_fits(self) -> bool:
        """The cost exceeds the capacity itself: no wait can make it fit."""
        return self.amount > self.capacity

    def __repr__(self) -> str:
        return (
            f"Check({self.scope!r}, {self.dimension.value}, {self.kind.name.lower()}, "
            f"amount={self.amount:g}, allowed={self.allowed:g}/{self.capacity:g})"
        )


def _class_share(capacity: float, reserve: float, priority: Priority) -> float:
    return capacity * (1.0 - priority.rank * reserve)


def class_allowance(share: float, amount: float, capacity: float) -> float:
    """How far a call may fill a dimension: its class's ``share``, but at least its cost.

    A lower class must leave the reserve free -- unless its cost alone is
    more than its share (small limits: ``requests_per_minute=5, burst=0.1``
    is a capacity of one request, of which ``scheduled`` may use 0.9).  Such
    a call may fill up to its own cost, i.e. it waits until the dimension
    is idle and then goes, instead of never fitting.  Only a cost above the
    capacity itself never fits (the allowance then stays below the cost).
    """
    return max(share, min(amount, capacity))


def build_checks(
    scope: str, spec: LimitSpec, cost: Cost, priority: Priority = Priority.INTERACTIVE
) -> list[Check]:
    """Every check ``cost`` must pass in ``scope`` under ``spec`` (none if unlimited).

    A bucket's capacity is ``burst × limit`` but at least one unit, so a
    single request always fits a small limit.
    """
    checks: list[Check] = []
    minute = (
        (Dimension.REQUESTS, spec.requests_per_minute, cost.requests),
        (Dimension.INPUT_TOKENS, spec.input_tokens_per_minute, cost.input_tokens),
        (Dimension.OUTPUT_TOKENS, spec.output_tokens_per_minute, cost.output_tokens),
        (Dimension.TOKENS, spec.tokens_per_minute, cost.tokens),
    )
    for dimension, limit, amount in minute:
        if limit is None:
            continue
        capacity = max(spec.burst * limit, 1.0)
        checks.append(
            Check(
                scope=scope,
                dimension=dimension,
                kind=CheckKind.BUCKET,
                capacity=capacity,
                allowed=class_allowance(
                    _class_share(capacity, spec.reserve, priority), float(amount), capacity
                ),
                amount=float(amount),
                rate=limit / 60.0,
                scaled=True,
            )
        )
    if spec.requests_per_day is not None:
        limit = spec.requests_per_day
        common = {
            "scope": scope,
            "dimension": Dimension.REQUESTS_PER_DAY,
            "capacity": float(limit),
            "allowed": class_allowance(
                _class_share(float(limit), spec.reserve, priority),
                float(cost.requests),
                float(limit),
            ),
            "amount": float(cost.requests),
        }
        if spec.day_window == "fixed":
            checks.append(
                Check(kind=CheckKind.DAY, offset=spec.day_reset_minute * 60.0, **common)  # type: ignore[arg-type]
            )
        else:
            checks.append(Check(kind=CheckKind.BUCKET, rate=limit / DAY, **common))  # type: ignore[arg-type]
    if spec.concurrency is not None:
        slots = spec.concurrency
        allowed = max(1, math.floor(slots * (1.0 - priority.rank * spec.reserve) + 1e-9))
        checks.append(
            Check(
                scope=scope,
                dimension=Dimension.CONCURRENCY,
                kind=CheckKind.LEASE,
                capacity=float(slots),
                allowed=float(allowed),
                amount=1.0,
                ttl=float(spec.lease_ttl_secs),
            )
        )
    return checks


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmitOp:
    """Admit all ``checks`` at once, or none; deny while any of ``scopes`` is paused."""

    scopes: tuple[str, ...]
    checks: tuple[Check, ...]
    lease_id: str | None
    aimd: AIMD


class AdmitResult(NamedTuple):
    """What the backend decided.  ``now`` is the backend's time of the decision.

    A NamedTuple rather than a frozen dataclass: one is built per admission and
    a tuple is four times cheaper to build; it is just as immutable.
    """

    granted: bool
    now: float
    wait: float = 0.0
    scope: str | None = None
    dimension: Dimension | None = None
    never_fits: bool = False
    paused_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Adjustment:
    """Change a bucket's level by ``delta`` units (negative: a refund)."""

    check: Check
    delta: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SettleOp:
    """Apply the adjustments and release the lease (if any) in ``lease_scope``."""

    scopes: tuple[str, ...]
    adjustments: tuple[Adjustment, ...]
    lease_scope: str | None
    lease_id: str | None
    aimd: AIMD


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseOp:
    """Pause ``scope`` for ``seconds`` from the backend's now (never shortens a pause)."""

    scope: str
    seconds: float
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseResult:
    now: float
    until: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Tightening:
    """What a provider said about one of our checks: remaining now, reset after."""

    check: Check
    remaining: float | None
    reset_after: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ObserveOp:
    """Tighten state from provider headers; ``lower`` applies an AIMD decrease."""

    scope: str
    tightenings: tuple[Tightening, ...] = field(default=())
    lower: bool = False
    aimd: AIMD = field(default_factory=AIMD)
