"""What a backend is asked to do: admission checks and operations, as plain values.

The :class:`~rateloop.admission.limiter.Limiter` turns a route, a priority
and the configured :class:`LimitSpec` of every scope into an
:class:`AdmitPlan`: a tuple of :class:`Check` values -- one per limited
dimension of every scope -- that does not depend on the cost, so it is built
once and cached.  Each call only adds its amounts (a small tuple taken from
its :class:`~rateloop.route.Cost`) and wraps both in an operation
(:class:`AdmitOp`, :class:`SettleOp`, :class:`PauseOp`, :class:`ObserveOp`).
A backend executes one operation atomically, in one step: the memory backend
under a lock, Redis in one Lua script.  Because the plan and the allowances
are computed here, once, the backends only do the arithmetic of
:mod:`rateloop.admission.gcra`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from operator import itemgetter, le
from typing import NamedTuple

from rateloop.admission.gcra import AIMD, DAY
from rateloop.admission.profile import PROFILES, AccountingProfile, default_burst
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Priority
from rateloop.signal import Dimension

__all__ = [
    "AdmitOp",
    "AdmitPlan",
    "AdmitResult",
    "BorrowOp",
    "Check",
    "CheckKind",
    "ObserveOp",
    "PauseOp",
    "PauseResult",
    "Priority",
    "Refused",
    "ReturnOp",
    "SettleOp",
    "Tightening",
    "build_checks",
    "class_allowance",
    "cost_vector",
]




class CheckKind(StrEnum):
    """How a dimension is limited: a refilled bucket, a fixed day window, leases."""

    BUCKET = "b"
    DAY = "d"
    LEASE = "l"


#: Where a check's amount comes from: an index into :func:`cost_vector`.
REQUESTS, INPUT, OUTPUT, TOKENS, ONE = range(5)


def cost_vector(cost: Cost) -> tuple[float, float, float, float, float]:
    """Every amount a check can take from ``cost``, indexed by ``Check.source``."""
    i, o = cost.input_tokens, cost.output_tokens
    return (float(cost.requests), float(i), float(o), float(i + o), 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One limited dimension of one scope, for a priority class -- whatever the cost.

    ``capacity`` is the bucket's burst (units), the day window's limit or the
    number of lease slots; ``share`` is how far the priority class may fill
    it (for leases: the slots it may hold).  A call's amount is
    ``cost_vector(cost)[source]`` and its allowance
    ``class_allowance(share, amount, ceiling)``, computed per call by
    :meth:`AdmitPlan.allowances`.  ``ceiling`` is the most one call may take:
    the limit itself (a minute's allowance for a paced bucket whose
    ``capacity`` holds a second of it).  ``scaled`` buckets follow the
    scope's AIMD factor.
    """

    scope: str
    dimension: Dimension
    kind: CheckKind
    capacity: float
    share: float
    source: int = REQUESTS
    rate: float = 0.0
    scaled: bool = False
    offset: float = 0.0
    ttl: float = 0.0
    ceiling: float = 0.0

    def __post_init__(self) -> None:
        if self.ceiling < self.capacity:  # unset (or below the capacity): the capacity
            object.__setattr__(self, "ceiling", self.capacity)

    def __repr__(self) -> str:
        return (
            f"Check({self.scope!r}, {self.dimension.value}, {self.kind.name.lower()}, "
            f"share={self.share:g}/{self.capacity:g})"
        )


def _class_share(capacity: float, reserve: float, priority: Priority) -> float:
    return capacity * (1.0 - priority.rank * reserve)


def class_allowance(share: float, amount: float, ceiling: float) -> float:
    """How far a call may fill a dimension: its class's ``share``, but at least its cost.

    A lower class must leave the reserve free -- unless its cost alone is
    more than its share (small limits: ``requests_per_minute=5, burst=0.1``
    is a capacity of one request, of which ``scheduled`` may use 0.9; or a
    paced bucket holding one second of a limit, smaller than one big call).
    Such a call may fill up to its own cost, i.e. it waits until the
    dimension is idle and then goes (leaving the bucket in debt), instead of
    never fitting -- as providers admit a big request from a full bucket.
    Only a cost above the ``ceiling`` (the limit itself) never fits.
    :meth:`AdmitPlan.allowances` is this function over every check at once.
    """
    return max(share, min(amount, ceiling))


_MINUTE = (
    (Dimension.REQUESTS, "requests_per_minute", REQUESTS),
    (Dimension.INPUT_TOKENS, "input_tokens_per_minute", INPUT),
    (Dimension.OUTPUT_TOKENS, "output_tokens_per_minute", OUTPUT),
    (Dimension.TOKENS, "tokens_per_minute", TOKENS),
)


def build_checks(
    scope: str,
    spec: LimitSpec,
    priority: Priority = Priority.INTERACTIVE,
    profile: AccountingProfile = PROFILES["generic"],
) -> list[Check]:
    """Every check a call must pass in ``scope`` under ``spec`` (none if unlimited).

    A bucket's capacity is ``burst × limit`` -- ``burst`` defaults to the
    profile's pacing (one second of the rate) -- but at least one unit, so a
    single request always fits a small limit; its ceiling is the limit.
    A ``tokens_per_minute`` limit counts input and output, or input only
    when the profile says so (Gemini).
    """
    checks: list[Check] = []
    burst = spec.burst if spec.burst is not None else default_burst(profile)
    input_only = not profile.tokens_include_output
    for dimension, name, counted in _MINUTE:
        limit: int | None = getattr(spec, name)
        if limit is None:
            continue
        capacity = max(burst * limit, 1.0)
        source = INPUT if counted == TOKENS and input_only else counted
        checks.append(
            Check(
                scope=scope,
                dimension=dimension,
                kind=CheckKind.BUCKET,
                capacity=capacity,
                share=_class_share(capacity, spec.reserve, priority),
                source=source,
                rate=limit / 60.0,
                scaled=True,
                ceiling=float(limit),
            )
        )
    if spec.requests_per_day is not None:
        day = float(spec.requests_per_day)
        share = _class_share(day, spec.reserve, priority)
        if spec.day_window == "fixed":
            check = Check(
                scope=scope,
                dimension=Dimension.REQUESTS_PER_DAY,
                kind=CheckKind.DAY,
                capacity=day,
                share=share,
                offset=spec.day_reset_minute * 60.0,
            )
        else:
            check = Check(
                scope=scope,
                dimension=Dimension.REQUESTS_PER_DAY,
                kind=CheckKind.BUCKET,
                capacity=day,
                share=share,
                rate=day / DAY,
            )
        checks.append(check)
    if spec.concurrency is not None:
        slots = spec.concurrency
        allowed = max(1, math.floor(slots * (1.0 - priority.rank * spec.reserve) + 1e-9))
        checks.append(
            Check(
                scope=scope,
                dimension=Dimension.CONCURRENCY,
                kind=CheckKind.LEASE,
                capacity=float(slots),
                share=float(allowed),
                source=ONE,
                ttl=float(spec.lease_ttl_secs),
            )
        )
    return checks


_TOKEN_SOURCES = {INPUT: 0, OUTPUT: 1, TOKENS: 2}


def _pick_few(sources: tuple[int, ...], vector: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(vector[i] for i in sources)


class AdmitPlan:
    """The cost-independent part of admitting a route at a priority: its checks.

    Built once per (route, priority) and cached by the limiter until limits
    change; a call then only computes its amounts (:meth:`amounts`, one
    ``itemgetter`` over :func:`cost_vector`); its allowances are the
    precomputed ``shares`` unless an amount exceeds its class's share
    (:meth:`allowances`).  ``refunds`` lists the
    token buckets a settle adjusts, with the index of their delta in
    ``(input, output, total)``.  ``last`` remembers the previous call's cost
    and its prepared values (read and replaced whole, so safe across threads);
    ``local`` the plan scaled to the local fallback's share.  ``lease_scopes``
    are the scopes with a concurrency limit, each counting its own leases
    (``lease_scope``, the first of them, tells whether the plan has a lease).
    """

    __slots__ = (
        "bookable",
        "capacities",
        "ceilings",
        "checks",
        "cold_scope",
        "fit_shares",
        "last",
        "learnable",
        "lease_scope",
        "lease_scopes",
        "local",
        "pick",
        "priority",
        "profile",
        "refunds",
        "scopes",
        "shares",
    )

    def __init__(
        self,
        scopes: tuple[str, ...],
        checks: tuple[Check, ...],
        priority: Priority,
        profile: AccountingProfile = PROFILES["generic"],
    ):
        self.scopes = scopes
        self.checks = checks
        self.priority = priority
        self.capacities = tuple(c.capacity for c in checks)
        self.shares = tuple(c.share for c in checks)
        # Every scope with a concurrency limit holds the call's lease: each counts its own
        # (a tenant's limit its tenant's calls, a provider's every tenant's) and a settle
        # frees it in all of them.  ``lease_scope``: the first, or None without a lease.
        self.lease_scopes = tuple(
            dict.fromkeys(c.scope for c in checks if c.kind is CheckKind.LEASE)
        )
        self.lease_scope = self.lease_scopes[0] if self.lease_scopes else None
        self.profile = profile
        self.learnable = False  # no scope has configured limits: learned ones may apply
        #: the provider scope whose cold start this plan keeps (see ``known.py``), or None
        self.cold_scope: str | None = None
        self.ceilings = tuple(c.ceiling for c in checks)
        # A booking (a start ahead) fills a bucket above the class's share until it
        # starts: only a class whose share is the whole capacity may book, so a lower
        # class never takes the reserve a higher one keeps (rank 0, or no reserve).
        self.bookable = all(c.share >= c.capacity for c in checks if c.kind is CheckKind.BUCKET)
        # A settle's deltas are (input, output, total) as the profile computes them;
        # a total-tokens limit counting input only (Gemini) takes the total delta too.
        self.refunds = tuple(
            (c, 2 if c.dimension is Dimension.TOKENS else _TOKEN_SOURCES[c.source])
            for c in checks
            if c.kind is CheckKind.BUCKET and c.source in _TOKEN_SOURCES
        )
        # The smallest class share of every check per source: a cost within all four
        # has every allowance equal to its share (the common case, no per-check work).
        self.fit_shares = tuple(
            min((c.share for c in checks if c.source == source), default=math.inf)
            for source in (REQUESTS, INPUT, OUTPUT, TOKENS)
        )
        sources = [c.source for c in checks]
        # ``itemgetter`` of two or more indices returns a tuple; of one, the item.
        self.pick: Callable[[tuple[float, ...]], tuple[float, ...]] = (
            itemgetter(*sources) if len(sources) >= 2 else partial(_pick_few, tuple(sources))
        )
        self.last: tuple[object, tuple[float, ...], tuple[float, ...], AdmitOp | None] = (
            None,
            (),
            (),
            None,
        )
        self.local: tuple[float, AdmitPlan] | None = None

    def __repr__(self) -> str:
        return f"AdmitPlan({self.scopes!r}, {self.priority.value}, checks={len(self.checks)})"

    def amounts(self, cost: Cost) -> tuple[float, ...]:
        """What ``cost`` takes from each check, in the order of ``checks``."""
        return self.pick(cost_vector(cost))

    def allowances(self, amounts: tuple[float, ...]) -> tuple[float, ...]:
        """:func:`class_allowance` of every check: how far this call may fill each.

        ``shares`` itself when no amount exceeds its share (then no check
        needs its cost's help); the limiter tests that case on the cost
        alone, against ``fit_shares``, before calling this.
        """
        if all(map(le, amounts, self.shares)):
            return self.shares
        return tuple(map(class_allowance, self.shares, amounts, self.ceilings))

    def never_fits(self, amounts: tuple[float, ...]) -> int | None:
        """The index of the first check whose ceiling (the limit) ``amounts`` exceed, else None."""
        for i, (amount, ceiling) in enumerate(zip(amounts, self.ceilings, strict=True)):
            if amount > ceiling:
                return i
        return None


class AdmitOp(NamedTuple):
    """Admit all checks of ``plan`` at once with these amounts, or none.

    Denied while any of ``plan.scopes`` is paused.  ``amounts`` and
    ``allowed`` run parallel to ``plan.checks``.  ``book`` > 0 lets the
    backend *book* the call: when only bucket levels make it wait, and that
    wait is at most ``book`` seconds, grant it now with a start that many
    seconds ahead (``AdmitResult.starts_in``), charging the buckets at once
    (GCRA scheduling: later calls queue behind it).  A pause, a day quota,
    a concurrency slot or a provider's block is never booked.  A NamedTuple
    (built with ``tuple.__new__`` on the hot path): one is built per admission.
    """

    plan: AdmitPlan
    amounts: tuple[float, ...]
    allowed: tuple[float, ...]
    lease_id: str | None
    aimd: AIMD
    book: float = 0.0


class BorrowOp(NamedTuple):
    """``op``, and when it is granted now, up to ``most`` more calls of its amounts: a lease.

    The backend decides ``op`` as it would alone (booked, it borrows
    nothing); granted now, it also charges ``k`` more times its amounts on
    every bucket, ``k`` whole and at most ``most``, as many as
    :func:`~rateloop.admission.gcra.lease_calls` allows on each bucket.  It
    answers ``(AdmitResult, k)``.  Only plans of rate buckets borrow
    (:mod:`rateloop.admission.lease`).
    """

    op: AdmitOp
    most: float


class ReturnOp(NamedTuple):
    """Give back a lease's unused units: ``left[i]`` of ``borrowed[i]`` charged on ``checks[i]``.

    ``since`` is the backend time they were charged at.  The backend gives
    back only :func:`~rateloop.admission.gcra.returnable` of each, and
    answers ``(now, given back per check)``.
    """

    checks: tuple[Check, ...]
    borrowed: tuple[float, ...]
    left: tuple[float, ...]
    since: float
    aimd: AIMD


#: Refusals in force, per scope: ``((scope, until), ...)`` in the backend's time.
Refused = tuple[tuple[str, float], ...]


class AdmitResult(NamedTuple):
    """What the backend decided.  ``now`` is the backend's time of the decision.

    A booked grant has ``starts_in`` > 0: the call may start that many seconds
    after ``now``, not before.  ``refused``: per scope of the plan whose state
    holds a refusal in force (a 429 observed, a pause), ``(scope, until)``: the
    provider has nothing in *that* scope before ``until`` (empty: none).  A
    process learns other processes' refusals from it (``Reservation.stale``),
    each for the scope it was recorded in -- a project's pause is not its
    model's, so the model's other projects keep their bookings.

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
    starts_in: float = 0.0
    refused: Refused = ()


class SettleOp(NamedTuple):
    """Change bucket levels by ``deltas`` (negative: a refund); release the lease.

    The backend answers ``(now, refused)``: its time, and the refusals in force
    in the settled scopes, ``(scope, until)`` each (see :class:`AdmitResult`).

    ``checks`` (token buckets of ``plan``) and ``deltas`` run parallel; the
    lease, if ``lease_id`` is set, is held in every one of ``plan.lease_scopes``
    and released from all of them.  A NamedTuple
    for the same reason as :class:`AdmitOp`.
    """

    plan: AdmitPlan
    checks: tuple[Check, ...]
    deltas: tuple[float, ...]
    lease_id: str | None
    aimd: AIMD
    #: The backend time the reservation started (granted_at + starts_in): a refund on
    #: a bucket booked further ahead counts from it.
    starts_at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseOp:
    """Pause ``scope`` for ``seconds`` from the backend's now (never shortens a pause).

    A pause is a refusal: booked starts before its end are void.
    """

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
    """Tighten state from provider headers; ``lower`` applies an AIMD decrease.

    ``refused``: the response was a refusal (a 429): the scope records that
    the provider has nothing before the end of the longest block it states
    (at least the backend's now); booked starts before it are void.  The
    backend answers ``(factor, refused_until)``.
    """

    scope: str
    tightenings: tuple[Tightening, ...] = field(default=())
    lower: bool = False
    aimd: AIMD = field(default_factory=AIMD)
    refused: bool = False
