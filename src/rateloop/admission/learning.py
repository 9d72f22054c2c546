"""Zero-config: limits learned from the provider's headers, shared through the backend.

How it works.  When no scope on a route's path has configured limits, the
limits a response's headers state (``x-ratelimit-limit-requests``,
``anthropic-ratelimit-input-tokens-limit``, IETF ``RateLimit-Policy``, ...)
become the observed scope's limits -- only when the window of the limit is
known (:func:`learned_field`).  The process that learns them writes them to
the backend (:class:`LearnOp`); every process sharing the backend reads the
learned limits of a zero-config route's scopes at most once per
:data:`REFRESH_SECONDS` (:class:`LearnedOp`, one extra round trip then), so
one process learns and all of them use it.  The learned values expire from
the backend after :data:`LEARNED_TTL_SECONDS` without being learned again.

The provider's *burst* is learned the same way, for configured and learned
limits alike (a configured ``burst`` always wins): a response's ``remaining``
and ``reset`` tell how much the provider's bucket holds, ``C ≈ remaining +
reset × limit / 60`` (:func:`capacity_estimate`).  When that is clearly less
than a minute's allowance (:data:`SHORT_BUCKET`) the provider enforces a
short bucket and the scope's buckets hold what it holds; when it is about a
minute (OpenAI's and Anthropic's headers describe the minute while they may
enforce per second) the profile's pacing stays.  Every estimate is a lower
bound of the capacity, so the learned value is the largest one seen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from rateloop.admission.gcra import DAY
from rateloop.admission.spec import LimitSpec
from rateloop.route import Route
from rateloop.signal import Dimension, LimitSignal, Observed

__all__ = [
    "BURST_FIELD",
    "LEARNED_TTL_SECONDS",
    "MARGIN_UNITS",
    "REFRESH_SECONDS",
    "SHORT_BUCKET",
    "STREAK_CAP",
    "LearnOp",
    "Learned",
    "LearnedOp",
    "Streaks",
    "capacity_estimate",
    "learned_field",
    "path",
    "stated_limits",
    "stretched",
    "tightened",
]

#: A zero-config route reads the learned limits from the backend at most this often.
REFRESH_SECONDS = 1.0
#: Learned limits stay in the backend this long after they were last learned.
LEARNED_TTL_SECONDS = 86_400.0

#: A provider bucket holding less than this fraction of a minute's allowance is a
#: short bucket, whose capacity becomes the scope's burst (when none is configured).
SHORT_BUCKET = 0.5
#: A learned bucket is planned this many units short of the provider's (see
#: :func:`capacity_estimate`).
MARGIN_UNITS = 1.0
#: The field under which the backend keeps a scope's learned burst (a fraction of a
#: minute, the largest capacity estimate seen; used only while below SHORT_BUCKET).
BURST_FIELD = "burst"
#: A learned burst is written to the backend again only when it grew by more than this.
_BURST_STEP = 1.02

#: The LimitSpec fields a provider's headers can teach (the integer rate limits).
LEARNABLE = (
    "requests_per_minute",
    "input_tokens_per_minute",
    "output_tokens_per_minute",
    "tokens_per_minute",
    "requests_per_day",
)
assert set(LEARNABLE) <= {f.name for f in fields(LimitSpec)}


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnOp:
    """Store limits learned for ``scope`` (field name, value) in the backend."""

    scope: str
    limits: tuple[tuple[str, float], ...]
    ttl: float = LEARNED_TTL_SECONDS


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedOp:
    """Read the learned limits of ``scopes``: the result maps scope -> {field: value}.

    The values are the limits (integers) and :data:`BURST_FIELD` (a fraction).
    """

    scopes: tuple[str, ...]


def path(scope: str) -> list[str]:
    """``scope`` and its ancestors, nearest first: ``a:b:c`` -> ``a:b:c``, ``a:b``, ``a``."""
    parts = scope.split(":")
    return [":".join(parts[:n]) for n in range(len(parts), 0, -1)]


#: Per-minute dimensions, keyed by what a provider's header describes.
_MINUTE_FIELDS = {
    Dimension.REQUESTS: "requests_per_minute",
    Dimension.INPUT_TOKENS: "input_tokens_per_minute",
    Dimension.OUTPUT_TOKENS: "output_tokens_per_minute",
    Dimension.TOKENS: "tokens_per_minute",
}


def learned_field(o: Observed) -> str | None:
    """The :class:`LimitSpec` field an observed limit may set, or None to ignore it.

    Only a known window maps: 60 s to the per-minute dimensions, a day (86400 s)
    of requests to ``requests_per_day``.  Any other window (GitHub's hour, an
    IETF ``w=3600``) and an unknown one are ignored: a per-hour limit read as
    per-minute would admit 60 times too much.
    """
    if o.window == 60.0:
        return _MINUTE_FIELDS.get(o.dimension)
    if o.window == DAY and o.dimension in (Dimension.REQUESTS, Dimension.REQUESTS_PER_DAY):
        return "requests_per_day"
    return None


def stated_limits(signal: LimitSignal) -> dict[str, int]:
    """The :class:`LimitSpec` fields ``signal``'s headers state a limit for (known windows;
    the first statement of a field wins): ``{"requests_per_minute": 500, ...}``."""
    found: dict[str, int] = {}
    for o in signal.observed:
        name = learned_field(o)
        if name is not None and o.limit is not None and o.limit >= 1:
            found.setdefault(name, int(o.limit))
    return found


def capacity_estimate(
    o: Observed, *, slack: float = 0.0, finest: float | None = None
) -> float | None:
    """What the provider's bucket of ``o`` holds, as a fraction of its minute's allowance.

    A bucket refilled at ``limit / 60`` a second that has ``remaining`` units
    now and is full after ``reset_after`` seconds holds ``remaining +
    reset_after × limit / 60``, less :data:`MARGIN_UNITS`: admitting exactly
    at the provider's capacity and rate leaves it a rounding error from
    refusing (and a refused request still spends its slot there); one unit
    short keeps it one unit ahead.  ``slack`` is the resolution of the reset
    (Anthropic's RFC 3339 times are whole seconds: the reset may be up to a
    second later than the refill), taken off so the estimate is never above
    the capacity.  ``finest`` is the smallest per-minute limit the burst will
    apply to (default: ``o.limit``): one burst serves every dimension, so the
    unit it is short by is a unit of the finest one -- a token reading (limit
    1.2M) taken one *token* short would leave the requests bucket (limit
    1,200) a rounding error from the provider's.  ``None`` when it cannot
    tell: a window other than a minute, a missing value, ``remaining < 1`` (a
    bucket in debt reports 0 and a reset longer than its capacity), or a
    bucket of no more than the margin.
    """
    if o.window != 60.0 or o.limit is None or o.limit < 1:
        return None
    if o.remaining is None or o.reset_after is None or o.remaining < 1:
        return None
    rate = o.limit / 60.0
    unit = o.limit / min(o.limit, finest) if finest is not None and finest >= 1 else 1.0
    held = o.remaining + max(0.0, o.reset_after - slack) * rate - MARGIN_UNITS * unit
    if held <= 0:
        return None
    return min(held / o.limit, 1.0)


def tightened(o: Observed) -> tuple[Dimension, ...]:
    """The dimensions whose state an observed ``remaining``/``reset`` tightens.

    ``remaining = R`` means at most R units are available now, whatever the
    window, so it tightens the dimension it names; a day's requests (Groq)
    also tighten ``requests_per_day``.
    """
    if o.window == DAY and o.dimension is Dimension.REQUESTS:
        return (Dimension.REQUESTS, Dimension.REQUESTS_PER_DAY)
    return (o.dimension,)


class Learned:
    """The learned limits of one limiter, and when each provider scope reads the backend's again.

    ``configured(scope)`` tells whether a scope has configured limits: nothing
    is learned as limits on a path that has some, but what the provider states
    for a configured scope is kept (:meth:`learn_stated`): a stated limit below
    the configured one is the one in force.
    """

    def __init__(self, configured: Callable[[str], bool], *, shared: bool) -> None:
        self._configured = configured
        self._shared = shared  # the backend is shared with other processes: read it
        self._lock = threading.Lock()
        self.specs: dict[str, LimitSpec] = {}
        #: configured scope -> the limits its provider's headers state (field: value);
        #: one below the configured value is the limit in force (see :meth:`learn_stated`)
        self.stated: dict[str, dict[str, int]] = {}
        #: scope -> the largest capacity estimate seen (a fraction of a minute)
        self.capacities: dict[str, float] = {}
        self._due: dict[str, float] = {}  # provider scope -> when its next read is due

    def get(self, scope: str) -> LimitSpec | None:
        return self.specs.get(scope)

    def burst(self, scope: str) -> float | None:
        """The learned burst of ``scope``: its provider's bucket, when that is short."""
        held = self.capacities.get(scope)
        if held is None or held >= SHORT_BUCKET:
            return None
        return held

    def learn_burst(self, scope: str, signal: LimitSignal) -> LearnOp | None:
        """Take the provider's bucket capacity from ``signal`` for ``scope``.

        The smallest estimate over the signal's per-minute dimensions (one
        burst serves them all), kept when it is larger than what was known
        (each estimate is a lower bound); the op storing it when it grew by
        more than 2 %, so a steady provider is written once.
        """
        slack = 1.0 if signal.provider == "anthropic" else 0.0
        # The finest per-minute limit named, whether or not its bucket can be read now
        # (a requests bucket at ``remaining: 0`` still needs its unit of margin).
        limits = [o.limit for o in signal.observed if o.window == 60.0 and o.limit]
        finest = min(limits) if limits else None
        estimates = [
            e
            for o in signal.observed
            if (e := capacity_estimate(o, slack=slack, finest=finest)) is not None
        ]
        if not estimates or not self._merge_capacity(scope, min(estimates)):
            return None
        return LearnOp(scope=scope, limits=((BURST_FIELD, self.capacities[scope]),))

    def _merge_capacity(self, scope: str, held: float) -> bool:
        with self._lock:
            old = self.capacities.get(scope)
            if old is not None and held <= old * _BURST_STEP:
                return False
            self.capacities[scope] = held
        return True

    def learn(self, scope: str, signal: LimitSignal) -> LearnOp | None:
        """Take limits from ``signal`` for ``scope``; the op storing them if they changed."""
        if any(self._configured(s) for s in path(scope)):
            return None
        found = stated_limits(signal)
        if not found or not self._merge(scope, found):
            return None
        spec = self.specs[scope]
        limits = tuple((n, int(getattr(spec, n))) for n in LEARNABLE if getattr(spec, n))
        return LearnOp(scope=scope, limits=limits)

    def learn_stated(self, scope: str, signal: LimitSignal) -> bool:
        """Take the limits ``signal`` states for ``scope``, a *configured* scope.

        A provider that states a limit below the configured one enforces its
        own: the configured value is a ceiling the provider may lower (a
        tier that is not the one configured, a limit changed since), never a
        licence to draw 429s.  Only the scope the headers describe (the
        observed one) is affected, never a configured ancestor (a model's
        total over several projects, a provider-wide scope).  Kept in this
        process only: every answer states the limit again, so each process
        reads it from its own first answer.  True when something changed.
        """
        if not self._configured(scope):
            return False
        found = stated_limits(signal)
        with self._lock:
            old = self.stated.get(scope, {})
            if not found or all(old.get(n) == v for n, v in found.items()):
                return False
            self.stated[scope] = {**old, **found}
        return True

    def forget_stated(self, scope: str) -> None:
        """``scope`` was configured anew: what its provider stated is learned again."""
        with self._lock:
            self.stated.pop(scope, None)

    def _merge(self, scope: str, found: Mapping[str, Any]) -> bool:
        with self._lock:
            old = self.specs.get(scope)
            spec = replace(old, **found) if old is not None else LimitSpec(**found)
            if spec == old:
                return False
            self.specs[scope] = spec
        return True

    def refresh_op(self, route: Route, now: float) -> LearnedOp | None:
        """The read of the backend's learned values for ``route``, when one is due.

        Only for a shared backend, at most once per :data:`REFRESH_SECONDS`
        per *provider scope* (``Route.provider_scope``): the provider learns
        and states limits for a project, every tenant included, so the
        tenants of a project share one read a second -- 100k tenants that
        each call now and then would otherwise pay a second round trip on
        nearly every admission.  The read is of the calling route's scopes.
        The limiter asks only for a route that can learn something (no
        configured limits, or a configured scope without ``burst``).
        """
        if not self._shared:
            return None
        key = route.provider_scope
        due = self._due.get(key)
        if due is not None and now < due:
            return None
        if len(self._due) >= 4096:
            self._due.clear()
        self._due[key] = now + REFRESH_SECONDS
        return LearnedOp(scopes=route.scopes)

    def forget_schedule(self) -> None:
        """Configured limits changed: every route decides again whether it reads."""
        self._due.clear()

    def apply(self, result: Mapping[str, Mapping[str, float]] | None) -> bool:
        """Adopt what the backend holds; True when a learned limit or burst changed."""
        changed = False
        for scope, limits in (result or {}).items():
            valid = {
                n: int(v)
                for n, v in limits.items()
                if n in LEARNABLE and isinstance(v, int | float) and v >= 1
            }
            if valid and not any(self._configured(s) for s in path(scope)):
                changed = self._merge(scope, valid) or changed
            held = limits.get(BURST_FIELD)
            if isinstance(held, int | float) and 0 < held <= 1:
                changed = self._merge_capacity(scope, float(held)) or changed
        return changed


#: A refusal streak stretches the stated block at most this much (before the jitter).
STREAK_CAP = 16.0
#: ... and by at most this many seconds beyond the stated block.
STREAK_MAX_EXTRA = 60.0
#: A streak whose last block ended this long ago starts again.
STREAK_FORGET_SECONDS = 60.0


def stretched(wait: float, factor: float) -> float:
    """A stated block of ``wait`` seconds stretched ``factor`` times (at most a minute more)."""
    return min(wait * factor, wait + STREAK_MAX_EXTRA)


@dataclass(slots=True)
class _Streak:
    count: int
    until: float  # when the last stretched block ends (the limiter's monotonic clock)


class Streaks:
    """Per scope: 429s in a row that came after their block was waited out.

    :meth:`observe` returns the factor a refusal's stated block is stretched
    by: 1 for the first refusal (and for any that arrives during a block: a
    call already in flight, or that states no block), then
    ``min(2^(n-1), STREAK_CAP) × (1 + U(0, 0.5))`` for the n-th refusal in a
    row that arrived after the previous block ended; the stretch adds at most
    :data:`STREAK_MAX_EXTRA` seconds (:func:`stretched`).  An answer ends the
    streak; so does a minute without refusals.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streaks: dict[str, _Streak] = {}

    def observe(self, scope: str, *, ok: bool, refused: bool, wait: float, now: float,
                draw: Callable[[], float]) -> float:
        with self._lock:
            if ok:
                self._streaks.pop(scope, None)
                return 1.0
            if not refused or wait <= 0:
                return 1.0  # no block stated: nothing to wait out, no evidence
            streak = self._streaks.get(scope)
            if streak is not None and now < streak.until:
                return 1.0  # in flight before the block began: no new evidence
            if streak is None or now - streak.until > STREAK_FORGET_SECONDS:
                if len(self._streaks) >= 4096:
                    self._streaks.clear()
                streak = self._streaks[scope] = _Streak(0, now)
            streak.count += 1
            factor = 1.0
            if streak.count > 1:
                factor = min(2.0 ** (streak.count - 1), STREAK_CAP) * (1.0 + 0.5 * draw())
            streak.until = now + stretched(wait, factor)
            return factor
