"""The far-wait rule: a refusal whose earliest retry is far away is a spent period.

How it works: a throttle says "wait"; how long decides what it is.  A wait
the loop may sleep through in one pause (at most the pause limit) is a short
throttle (``temporary``), whatever window the message names — "requests per
day … try again in 8.64s" is a continuously refilled bucket handing back one
slot, as long as that slot comes back within :data:`REFILL_SECS` (a minute):
a day-named limit that hands back one slot every few minutes is spent for
practical purposes.  A wait longer than the pause limit is a spent allowance
(``period_quota``) whatever its wording — "please wait a moment and try
again in 12702s" is not a short throttle, and neither is Copilot's "Please
try again in 58 hours".  ``reset_at`` then keeps the real distance, even past
the one-day clamp on ``retry_after``.

The threshold is the pause limit: :data:`rateloop.signal.DEFAULT_PAUSE_LIMIT_SECS`
(3600 s, the default of :attr:`rateloop.Policy.pause_limit_secs`) unless the
caller passes its own (``pause_limit=``).  The
edge is inclusive: a wait exactly equal to the threshold still fits.
"""

from __future__ import annotations

import math
from datetime import datetime

from rateloop.classify._time import add_seconds
from rateloop.signal import DEFAULT_PAUSE_LIMIT_SECS, Kind

__all__ = ["REFILL_SECS", "far_wait_threshold", "settle_kind"]

#: A day-named limit whose stated wait is at most this many seconds is a
#: continuously refilled bucket ("requests per day … try again in 8.64s"):
#: a short throttle.  Longer, the day named decides: a spent period.
REFILL_SECS = 60.0


def far_wait_threshold(pause_limit: float | None) -> float:
    """The threshold in seconds: ``pause_limit`` checked, or the default pause limit."""
    if pause_limit is None:
        return DEFAULT_PAUSE_LIMIT_SECS
    if isinstance(pause_limit, bool) or not isinstance(pause_limit, int | float):
        raise TypeError(
            f"pause_limit must be a number of seconds or None, got {pause_limit!r}"
        )
    if not math.isfinite(pause_limit) or pause_limit < 0:
        raise ValueError(f"pause_limit must be finite and >= 0 seconds, got {pause_limit!r}")
    return float(pause_limit)


def settle_kind(
    kind: Kind,
    *,
    wait: float | None,
    reset_at: datetime | None,
    now: datetime,
    threshold: float,
    soft_period: bool = False,
) -> tuple[Kind, datetime | None]:
    """Apply the far-wait rule to a reading: ``(kind, reset_at)``.

    ``wait`` is the unclamped earliest retry in seconds.  A ``temporary``
    whose wait exceeds ``threshold`` becomes ``period_quota`` (``reset_at`` =
    ``now + wait`` unless already known).  A ``period_quota`` named only by a
    phrase (``soft_period``) whose stated wait is at most :data:`REFILL_SECS`
    (and fits the threshold) becomes ``temporary``.
    """
    if wait is None:
        return kind, reset_at
    if kind is Kind.TEMPORARY and wait > threshold:
        return Kind.PERIOD_QUOTA, reset_at or add_seconds(now, wait)
    if kind is Kind.PERIOD_QUOTA and soft_period and wait <= min(threshold, REFILL_SECS):
        return Kind.TEMPORARY, None
    return kind, reset_at
