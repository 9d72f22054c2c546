"""The live state of every scope: limits, headroom per dimension, pauses (sans-IO).

How it works.  :mod:`rateloop.observe.redis_state` reads the limiter's raw
keys from Redis (:class:`RawScope`: the state hash, the pause string, the
live lease count) together with the server's time; :func:`scope_state` turns
them into a :class:`ScopeState` with the admission's own arithmetic
(:func:`~rateloop.admission.plan.build_checks` for capacities and rates,
:mod:`~rateloop.admission.gcra` for draining buckets, day windows and the AIMD
factor).  Nothing here touches a process's memory: what any worker on the
same Redis and prefix admitted is what is shown.

What Redis does not hold is taken from the policy: the configured limits.
Limits learned from a provider's headers (zero-config) are in Redis and
govern a scope without configured limits, as they do in the limiter.  A
scope with state in Redis but neither is listed with what is known (pause,
AIMD factor, leases) and no headroom.  The *effective* limit shown is the
governing one scaled by the scope's AIMD factor.

Without either, what Redis still knows is shown: the day count in its state
hash, and the day allowance and concurrency slots the limiter recorded in the
scope's history (``L:<dimension>``, :func:`recorded_limits`; the per-minute
limits there include the AIMD factor, so they are not taken): such a scope is
``governed_by="recorded"``, its day window assumed to reset at 00:00 UTC (the
default; the reset time is configuration).  A day count with no limit known
at all is in ``ScopeState.counts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from rateloop.admission.gcra import AIMD, day_window, drained, effective_factor
from rateloop.admission.history import ScopeHistory
from rateloop.admission.plan import CheckKind, build_checks
from rateloop.admission.profile import AccountingProfile, profile_for
from rateloop.admission.spec import LimitSpec

__all__ = [
    "DimensionState",
    "RawScope",
    "ScopeState",
    "Snapshot",
    "recorded_limits",
    "scope_state",
    "uncounted_day",
]

_KINDS = {CheckKind.BUCKET: "bucket", CheckKind.DAY: "day", CheckKind.LEASE: "concurrency"}
_CONFIG_FIELD = {
    "requests": "requests_per_minute",
    "input_tokens": "input_tokens_per_minute",
    "output_tokens": "output_tokens_per_minute",
    "tokens": "tokens_per_minute",
    "requests_per_day": "requests_per_day",
    "concurrency": "concurrency",
}


@dataclass(frozen=True, slots=True)
class RawScope:
    """What Redis holds for one scope key, as read."""

    scope: str
    state: Mapping[str, str] = field(default_factory=dict)
    pause: str | None = None
    leases: int = 0
    learned: Mapping[str, str] = field(default_factory=dict)  # LimitSpec field -> value


@dataclass(frozen=True, slots=True, kw_only=True)
class DimensionState:
    """One limited dimension of a scope, now."""

    dimension: str
    kind: str  # bucket | day | concurrency
    configured: int  # the governing limit: configured, else learned (per minute, day, slots)
    effective: float  # configured x the AIMD factor for per-minute buckets
    capacity: float  # what may be in use at once (burst x limit, day limit, slots)
    used: float
    headroom: float  # capacity - used, never below 0
    blocked_until: datetime | None = None  # a provider's remaining=0 until its reset
    resets_at: datetime | None = None  # the end of a fixed day window

    @property
    def headroom_fraction(self) -> float:
        return self.headroom / self.capacity if self.capacity > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeState:
    """A scope key's limits, headroom and pause, read from the shared store."""

    scope: str
    configured: bool
    factor: float  # the AIMD factor: 1.0 unless 429s despite admission lowered it
    paused_until: datetime | None
    pause_reason: str | None
    leases: int
    dimensions: tuple[DimensionState, ...] = ()
    learned: Mapping[str, int] = field(default_factory=dict)  # from the provider's headers
    governed_by: str | None = None  # "configured", "learned", "recorded", or None: no limits
    # Day counts Redis holds for a scope with no limit known (neither governed nor recorded).
    counts: Mapping[str, float] = field(default_factory=dict)
    # Calls sleeping on the scope now, by priority, from the shared event stream
    # (rateloop.observe.waiters); empty when no RedisEventSink writes there.
    waiters: Mapping[str, int] = field(default_factory=dict)

    @property
    def paused(self) -> bool:
        return self.paused_until is not None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["paused"] = self.paused
        for dim, src in zip(out["dimensions"], self.dimensions, strict=True):
            dim["headroom_fraction"] = round(src.headroom_fraction, 4)
        jsonable: dict[str, Any] = _jsonable(out)
        return jsonable


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """Every scope at one moment of the server's clock."""

    at: datetime
    prefix: str
    scopes: tuple[ScopeState, ...]

    def scope(self, key: str) -> ScopeState | None:
        return next((s for s in self.scopes if s.scope == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "prefix": self.prefix,
            "scopes": [s.to_dict() for s in self.scopes],
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value


def _num(state: Mapping[str, str], name: str, default: float) -> float:
    raw = state.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        return default


_LEARNABLE = (
    "requests_per_minute",
    "input_tokens_per_minute",
    "output_tokens_per_minute",
    "tokens_per_minute",
    "requests_per_day",
)


def _learned(raw: Mapping[str, str]) -> dict[str, int]:
    """The learned limits Redis holds, as LimitSpec fields (anything else ignored)."""
    out: dict[str, int] = {}
    for name in _LEARNABLE:
        try:
            value = int(float(raw[name]))
        except (KeyError, ValueError):
            continue
        if value >= 1:
            out[name] = value
    return out


#: The limits a scope's history records exactly (a bucket's is scaled by the AIMD factor).
_RECORDED = {"requests_per_day": "requests_per_day", "concurrency": "concurrency"}


def recorded_limits(history: ScopeHistory | None) -> dict[str, int]:
    """The day allowance and slots the limiter last recorded in ``history``, as LimitSpec fields."""
    out: dict[str, int] = {}
    for minute in reversed(history.minutes if history is not None else ()):
        for dimension, name in _RECORDED.items():
            usage = minute.usage.get(dimension)
            if name not in out and usage is not None and usage.limit and usage.limit >= 1:
                out[name] = int(usage.limit)
    return out


def uncounted_day(raw: RawScope, now: float) -> bool:
    """Does Redis hold a day count in today's window (00:00 UTC) for a scope with no limits?

    The reader then looks for the limit in the scope's history.
    """
    return _day_count(raw.state, now) is not None or raw.leases > 0


def _day_count(state: Mapping[str, str], now: float) -> float | None:
    """The day count of the window containing ``now`` (reset 00:00 UTC assumed), if any."""
    index, _ = day_window(now, 0.0)
    if _num(state, "requests_per_day:w", float("nan")) != index:
        return None
    return _num(state, "requests_per_day:c", 0.0)


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def scope_state(
    raw: RawScope,
    spec: LimitSpec | None,
    now: float,
    *,
    aimd: AIMD | None = None,
    profile: AccountingProfile | None = None,
    waiters: Mapping[str, int] | None = None,
    recorded: Mapping[str, int] | None = None,
) -> ScopeState:
    """The state of one scope at server time ``now`` (seconds since the epoch).

    ``profile`` is how the scope's provider charges usage (it sets the
    default burst); by default the profile of the scope's provider, as
    :meth:`~rateloop.admission.Limiter.profile_of` finds it.  ``waiters``
    is the scope's calls waiting now by priority
    (:func:`rateloop.observe.waiters.waiters`); ``recorded`` the limits
    :func:`recorded_limits` found in its history, used when it has neither
    configured nor learned limits.
    """
    aimd = aimd or AIMD()
    learned = _learned(raw.learned)
    governed_by = "configured" if spec is not None else None
    if spec is None and learned:
        spec, governed_by = LimitSpec.from_mapping(learned), "learned"
    if spec is None and recorded:
        spec, governed_by = LimitSpec.from_mapping(dict(recorded)), "recorded"
    counts: dict[str, float] = {}
    if spec is None and (count := _day_count(raw.state, now)) is not None:
        counts["requests_per_day"] = count
    if profile is None:
        profile = profile_for(raw.scope.split(":", 1)[0], spec.profile if spec else None)
    st = raw.state
    factor = effective_factor(_num(st, "f", 1.0), _num(st, "fs", now), now, aimd)
    paused_until: datetime | None = None
    reason: str | None = None
    if raw.pause:
        until_s, _, why = raw.pause.partition("|")
        try:
            until = float(until_s)
        except ValueError:
            until = now
        if until > now:
            paused_until, reason = _at(until), why or None
    dims: list[DimensionState] = []
    for check in build_checks(raw.scope, spec, profile=profile) if spec is not None else []:
        name = check.dimension.value
        configured = int(getattr(spec, _CONFIG_FIELD[name]))
        block = _num(st, f"{name}:b", 0.0)
        blocked = _at(block) if block > now else None
        resets: datetime | None = None
        effective = float(configured)
        if check.kind is CheckKind.BUCKET:
            rate = check.rate * (factor if check.scaled else 1.0)
            if check.scaled:
                effective = configured * factor
            used = drained(_num(st, f"{name}:l", 0.0), _num(st, f"{name}:t", now), now, rate)
        elif check.kind is CheckKind.DAY:
            index, finish = day_window(now, check.offset)
            same = _num(st, f"{name}:w", float("nan")) == index
            used = _num(st, f"{name}:c", 0.0) if same else 0.0
            resets = _at(finish)
        else:
            used = float(raw.leases)
        headroom = 0.0 if blocked is not None else max(0.0, check.capacity - used)
        dims.append(
            DimensionState(
                dimension=name,
                kind=_KINDS[check.kind],
                configured=configured,
                effective=effective,
                capacity=check.capacity,
                used=used,
                headroom=headroom,
                blocked_until=blocked,
                resets_at=resets,
            )
        )
    return ScopeState(
        scope=raw.scope,
        configured=governed_by == "configured",
        learned=learned,
        governed_by=governed_by,
        factor=factor,
        paused_until=paused_until,
        pause_reason=reason,
        leases=raw.leases,
        dimensions=tuple(dims),
        waiters=dict(waiters or {}),
        counts=counts,
    )
