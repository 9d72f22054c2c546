"""The pure arithmetic of admission: continuous buckets, day windows, leases, AIMD.

How it works.  Every rate dimension is a *continuously refilled bucket*
(the token-bucket form of GCRA).  Its state is the ``level`` of capacity in
use at time ``ts``; the level drains at ``rate`` units per second, so it is
never stored twice and never refilled in steps.  A call of ``amount`` units
fits when ``drained_level + amount <= allowed``, where ``allowed`` is the
burst capacity left to the call's priority class.  When it does not fit, the
wait until it would is ``(drained_level + amount - allowed) / rate`` -- exact,
because nothing else changes the level meanwhile except other admissions.

The bound this gives (used by the stress and property tests): the level is
always in ``[0, capacity]`` after an admission and drains at ``rate``, so the
units admitted in any closed window of length ``W`` are at most
``capacity + rate * W``.  For a per-minute limit ``L`` with ``burst = b``
that is ``b*L + L*W/60``.

A fixed day window counts requests in ``[start, start + 86400)`` where the
start is the configured UTC reset time; a rolling day is a bucket refilled at
``L / 86400`` per second with capacity ``L``.  Concurrency is a set of leases,
each with an expiry, so a crashed holder frees its slot after the TTL.

The effective rate of a scope's per-minute buckets is multiplied by an AIMD
``factor``: a 429 that arrived despite admission multiplies it by
``decrease`` (not below ``floor``, at most once per ``cooldown``), and it
recovers linearly by ``recover_per_minute`` back to 1.

A *local lease* (:mod:`rateloop.admission.lease`) borrows whole calls' worth
of a bucket beyond the call that asks: :func:`lease_calls` is how many, a
slice of the allowance that shrinks as the bucket fills (TensorZero's rule:
25 % below half full, 10 % up to 80 %, 5 % above).  :func:`returnable` is how
much of a lease's unused part may go back: only what cannot have drained
since it was borrowed, so a return never credits capacity twice.

The Redis backend carries the same arithmetic in Lua (``_common.lua``); the
conformance suite runs the same tests against both.  Nothing here reads a
clock: ``now`` is always passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "AIMD",
    "DAY",
    "LEASE_POLL_SECONDS",
    "Bucket",
    "bucket_fit",
    "bucket_wait",
    "day_window",
    "drained",
    "effective_factor",
    "lease_calls",
    "lowered_factor",
    "pause_spread",
    "returnable",
]

DAY = 86_400.0

#: A concurrency denial is retried after at most this long: a lease may be
#: released at any moment, but only its expiry is known in advance.
LEASE_POLL_SECONDS = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class AIMD:
    """How a 429 despite admission lowers a scope's rate, and how it recovers.

    ``decrease`` multiplies the factor (0.8: 20 % slower), ``floor`` is the
    lowest factor, ``recover_per_minute`` the additive recovery (3.0: +5 % of
    the configured limit each second, so one decrease is gone in 4 s) and
    ``cooldown`` the seconds during which further 429s (from the same burst)
    do not lower it again.  It applies only where no header tells the truth.
    """

    decrease: float = 0.8
    floor: float = 0.25
    recover_per_minute: float = 3.0
    cooldown: float = 2.0

    def __post_init__(self) -> None:
        checks = {
            "decrease": 0 < self.decrease < 1,
            "floor": 0 < self.floor <= 1,
            "recover_per_minute": self.recover_per_minute > 0,
            "cooldown": self.cooldown >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"AIMD.{name} is out of range: {getattr(self, name)!r}")

    @property
    def recover_per_second(self) -> float:
        return self.recover_per_minute / 60.0


@dataclass(slots=True)
class Bucket:
    """Mutable bucket state for the in-memory backend: level in use at ``ts``."""

    level: float = 0.0
    ts: float = 0.0
    blocked_until: float = 0.0


def drained(level: float, ts: float, now: float, rate: float) -> float:
    """The level at ``now`` after draining at ``rate`` since ``ts``."""
    return max(0.0, level - max(0.0, now - ts) * rate)


def bucket_wait(level_now: float, amount: float, allowed: float, rate: float) -> float:
    """Seconds until ``amount`` fits under ``allowed``; 0 when it fits now."""
    over = level_now + amount - allowed
    if over <= 0:
        return 0.0
    return over / rate


def bucket_fit(
    level: float, ts: float, now: float, rate: float, amount: float, allowed: float
) -> tuple[float, float]:
    """``(drained(level, ts, now, rate), bucket_wait(that, amount, allowed, rate))`` in one call.

    The admission hot path needs both; one call instead of two (and no
    ``max``) is about a third of the cost.  A property test holds it equal
    to the two functions it fuses.
    """
    elapsed = now - ts
    if elapsed > 0.0:
        level -= elapsed * rate
    level = level if level > 0.0 else 0.0  # max(0.0, level), without the call
    over = level + amount - allowed
    return level, (over / rate if over > 0.0 else 0.0)


def day_window(wall: float, offset: float) -> tuple[int, float]:
    """The index of the fixed day window containing ``wall`` and when it ends.

    ``offset`` is the reset time as seconds after 00:00 UTC; ``wall`` is
    seconds since the epoch.
    """
    index = math.floor((wall - offset) / DAY)
    return index, (index + 1) * DAY + offset


def effective_factor(factor: float, since: float, now: float, aimd: AIMD) -> float:
    """The AIMD factor at ``now``: ``factor`` set at ``since``, recovering linearly."""
    return min(1.0, factor + max(0.0, now - since) * aimd.recover_per_second)


def lowered_factor(
    factor: float, since: float, last_decrease: float, now: float, aimd: AIMD
) -> tuple[float, bool]:
    """The factor after a 429 at ``now``, and whether it was lowered.

    Inside the cooldown after the previous decrease the factor is unchanged.
    """
    current = effective_factor(factor, since, now, aimd)
    if now - last_decrease < aimd.cooldown:
        return current, False
    return max(aimd.floor, current * aimd.decrease), True


def pause_spread(remaining: float, unit: float) -> float:
    """Extra seconds a waiter adds after a pause so waiters do not stampede.

    Up to 10 % of the remaining pause, at most one second; ``unit`` is a
    uniform random number in ``[0, 1)``.
    """
    return min(0.1 * max(0.0, remaining), 1.0) * unit


#: A lease's slice of a bucket's allowance by how full the bucket is after the call that
#: borrows: (fill below, slice), the last one for anything fuller.
LEASE_SLICES = ((0.5, 0.25), (0.8, 0.10), (math.inf, 0.05))


def lease_calls(used: float, allowed: float, amount: float) -> float:
    """How many more calls of ``amount`` a lease may borrow from one bucket (whole, >= 0).

    ``used`` is the bucket's level after the borrowing call itself, of the
    ``allowed`` its class may fill.  The lease keeps to a slice of ``allowed``
    that shrinks as the bucket fills (:data:`LEASE_SLICES`), and to the room
    left.  A bucket the call takes nothing from does not limit it (``inf``).
    ``_common.lua``'s ``lease_calls`` is the same arithmetic.
    """
    if amount <= 0.0:
        return math.inf
    slice_ = next(s for below, s in LEASE_SLICES if used < below * allowed)
    return max(0.0, float(math.floor(min(slice_ * allowed, allowed - used) / amount)))


def returnable(borrowed: float, left: float, rate: float, since: float, at: float) -> float:
    """How much of a lease's unused ``left`` (of ``borrowed`` units) may go back at ``at``.

    The lease's units were charged at ``since``; the bucket drains at most at
    ``rate`` (its configured rate: an AIMD factor only slows it), so at ``at``
    at least ``borrowed - rate * (at - since)`` of them are still in it.  Only
    that much of ``left`` is given back: the bucket then holds what it would
    hold had the unused units never been borrowed, or more -- never less, so
    a return never lets a later call through that the bucket would not have
    admitted without the lease (the bound of :mod:`rateloop.admission.lease`).
    """
    return min(left, max(0.0, borrowed - rate * max(0.0, at - since)))
