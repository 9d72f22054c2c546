"""Anthropic's subscription windows (``anthropic-ratelimit-unified-*``): when they block.

Claude subscription traffic (Claude Code, the Agent SDK on a plan) answers
with a *unified* rate limit instead of per-minute ones: a 5-hour and a 7-day
window, each with a utilisation (0..1), a status and a reset time (seconds
since the epoch), plus an overall status and reset::

    anthropic-ratelimit-unified-status: allowed | allowed_warning | rejected
    anthropic-ratelimit-unified-reset: 1767225600
    anthropic-ratelimit-unified-5h-utilization: 0.42
    anthropic-ratelimit-unified-5h-status: allowed
    anthropic-ratelimit-unified-5h-reset: 1767200000
    anthropic-ratelimit-unified-7d-...

A window that is ``rejected`` (or used up, utilisation >= 1) refuses every
call until its reset, so admission pauses the scope until then: no worker
should spend a request to find out.  Nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

__all__ = ["subscription_block"]

_PREFIX = "anthropic-ratelimit-unified-"


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def subscription_block(headers: Mapping[str, str], now: datetime) -> float | None:
    """Seconds until an exhausted subscription window resets, or None if none is.

    >>> from datetime import UTC, datetime
    >>> now = datetime(2026, 1, 1, tzinfo=UTC)
    >>> subscription_block({"anthropic-ratelimit-unified-5h-status": "rejected",
    ...     "anthropic-ratelimit-unified-5h-reset": str(now.timestamp() + 900)}, now)
    900.0
    >>> subscription_block({"anthropic-ratelimit-unified-status": "allowed_warning"}, now)
    """
    lowered = {k.lower(): v for k, v in headers.items() if k.lower().startswith(_PREFIX)}
    if not lowered:
        return None
    wall = now.timestamp()
    block: float | None = None
    for window in ("", "5h-", "7d-"):
        status = lowered.get(f"{_PREFIX}{window}status", "").strip().lower()
        used = _number(lowered.get(f"{_PREFIX}{window}utilization"))
        if status != "rejected" and (used is None or used < 1.0):
            continue
        reset = _number(lowered.get(f"{_PREFIX}{window}reset"))
        if reset is None and window:
            reset = _number(lowered.get(f"{_PREFIX}reset"))
        if reset is None or reset <= wall:
            continue
        block = max(block or 0.0, reset - wall)
    return block
