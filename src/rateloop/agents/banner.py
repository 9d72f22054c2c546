"""What ``rateloop run`` tells a human: the wait banner, the live countdown, the final errors.

A CLI agent step that stalls for minutes without a word looks hung, and
people kill it.  So every wait is announced first (:func:`rate_limit_banner`),
and when stderr is a terminal a one-line countdown is redrawn in place while
the wait runs (:func:`wait_visibly`).  The wait itself goes through the
injected clock, so tests see every second of it without sleeping.

The texts are part of the contract (recipes and CI logs grep for them); the
tests pin them exactly.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TextIO

from rateloop._clock import Clock
from rateloop.signal import Kind

__all__ = [
    "RULE",
    "exhausted_message",
    "format_seconds",
    "is_terminal",
    "period_quota_message",
    "rate_limit_banner",
    "wait_visibly",
]

RULE = "=" * 80


def format_seconds(seconds: float) -> str:
    """``60`` for 60.0, ``2.5`` for 2.5: whole seconds print without a decimal point."""
    if math.isfinite(seconds) and seconds == int(seconds):
        return str(int(seconds))
    return f"{seconds:g}"


def rate_limit_banner(
    *,
    signal: str,
    wait: float,
    retry: int,
    max_retries: int,
    attempt: int,
    total: int,
    kind: Kind = Kind.TEMPORARY,
) -> str:
    """The banner printed before every wait (``retry`` counts from 1, ``attempt`` is the next run).

    Its headline names what was detected: ``RATE LIMIT`` for a throttle,
    ``OVERLOADED`` for an overloaded provider (529, ``overloaded_error``).

    >>> print(rate_limit_banner(signal="hit your rate limit", wait=60, retry=1,
    ...                         max_retries=5, attempt=2, total=6))  # doctest: +ELLIPSIS
    ====...
    ⏳ RATE LIMIT detected (signal: "hit your rate limit")
       Agent step throttled by the provider. This is transient — backing off.
       Waiting 60s before retry 1/5 (attempt 2 of 6) ...
    ====...
    """
    if kind is Kind.OVERLOAD:
        headline = f'⏳ OVERLOADED detected (signal: "{signal}")'
        why = "   The provider is over capacity (not your limit). This is transient — backing off."
    else:
        headline = f'⏳ RATE LIMIT detected (signal: "{signal}")'
        why = "   Agent step throttled by the provider. This is transient — backing off."
    return "\n".join(
        (
            RULE,
            headline,
            why,
            f"   Waiting {format_seconds(wait)}s before retry {retry}/{max_retries}"
            f" (attempt {attempt} of {total}) ...",
            RULE,
        )
    )


def exhausted_message(label: str, retries: int) -> str:
    """The error printed when the rate limit outlasted every retry (exit 75)."""
    return (
        f"Error: {label} rate limit persisted after {retries} retries"
        f" ({retries + 1} attempts total).\n"
        "The provider kept throttling this step. Increase RATELOOP_MAX_RETRIES\n"
        "or RATELOOP_BASE_DELAY_SECS, or retry later."
    )


def period_quota_message(
    label: str, *, signal: str, reset_at: datetime | None, now: datetime
) -> str:
    """The error printed for a usage/quota window that will not reopen soon (exit 75)."""
    head = f'Error: {label} hit a usage limit (signal: "{signal}"); not retrying in this run.'
    if reset_at is None:
        return f"{head}\nThe provider did not say when it resets; retry later."
    left = max(0.0, (reset_at - now).total_seconds())
    return (
        f"{head}\nThe limit resets at {reset_at.isoformat(timespec='seconds')}"
        f" (in {_human_duration(left)}); retry after that."
    )


def _human_duration(seconds: float) -> str:
    minutes = math.ceil(seconds / 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m"


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (False for closed or exotic streams)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or exotic streams
        return False


def wait_visibly(clock: Clock, seconds: float, stream: TextIO) -> None:
    """Sleep ``seconds`` on ``clock``; on a terminal, redraw a countdown line every second.

    Off a terminal (CI logs, pipes) the banner alone is printed and the wait
    is one sleep, so logs are not flooded with carriage returns.
    """
    if seconds <= 0:
        return
    if not is_terminal(stream):
        clock.sleep(seconds)
        return
    remaining = seconds
    width = 0
    while remaining > 0:
        line = f"\r   retrying in {math.ceil(remaining)}s ..."
        width = max(width, len(line))
        stream.write(line.ljust(width))
        stream.flush()
        step = min(1.0, remaining)
        clock.sleep(step)
        remaining -= step
    stream.write("\r" + " " * width + "\r")
    stream.flush()
