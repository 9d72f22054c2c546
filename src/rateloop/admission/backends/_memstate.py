"""The memory backend's state of a scope, and the writes of an admission to it.

Kept apart from :mod:`.memory` (the backend's operations) so that each stays
short: a scope's buckets, day windows, leases, pause and AIMD factor
(:class:`ScopeState`); the wait for a concurrency slot (:func:`lease_wait`);
a booked call's charges (:func:`apply_booked`); an admission in the history
(:func:`record`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rateloop.admission.gcra import AIMD, LEASE_POLL_SECONDS, Bucket, effective_factor
from rateloop.admission.history import MemoryHistory
from rateloop.admission.plan import Check
from rateloop.signal import Dimension

__all__ = ["COUNT", "LIMIT", "USED", "Day", "ScopeState", "apply_booked", "lease_wait", "record"]

# The history's field names of each dimension (``admit.lua``'s): units used, the limit in
# force, the count held.  Built once: an enum's ``.value`` is a Python-level descriptor.
USED = {d: "u:" + d.value for d in Dimension}
LIMIT = {d: "L:" + d.value for d in Dimension}
COUNT = {d: "c:" + d.value for d in Dimension}


@dataclass(slots=True)
class Day:
    count: float = 0.0
    index: int = -(2**62)
    blocked_until: float = 0.0


@dataclass(slots=True)
class ScopeState:
    buckets: dict[Dimension, Bucket] = field(default_factory=dict)
    days: dict[Dimension, Day] = field(default_factory=dict)
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


def lease_wait(state: ScopeState, now: float, allowed: float) -> float:
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


def apply_booked(
    staged: list[tuple[Check, ScopeState, Any, float, float]],
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


def record(
    history: MemoryHistory,
    wall: float,
    staged: list[tuple[Check, ScopeState, Any, float, float]],
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
                fields[COUNT[dimension]] = float(len(state.leases))
                fields[LIMIT[dimension]] = allowed
                continue
            used = USED[dimension]
            fields[used] = fields.get(used, 0.0) + amount
            if type(slot) is Bucket:  # per minute, at the rate in force (AIMD included)
                fields[LIMIT[dimension]] = extra * 60.0
            else:
                fields[COUNT[dimension]] = value
                fields[LIMIT[dimension]] = allowed
