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
from rateloop.classify.agent_results import allowance_words
from rateloop.signal import Kind

__all__ = [
    "RULE",
    "WAIT_CHUNK_SECS",
    "allowance_line",
    "clock_duration",
    "exhausted_message",
    "format_seconds",
    "human_duration",
    "is_terminal",
    "period_quota_message",
    "rate_limit_banner",
    "reset_banner",
    "wait_until",
    "wait_visibly",
]

RULE = "=" * 80


def allowance_line(code: str) -> str:
    """The line that names the allowance that ran out (``code``: an allowance code).

    >>> allowance_line("weekly_limit")
    'The allowance that ran out: the weekly limit (weekly_limit).'
    """
    return f"The allowance that ran out: {allowance_words(code) or code} ({code})."


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
    allowance: str | None = None,
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
    lines = [RULE, headline, why]
    if allowance:
        lines.append(f"   {allowance_line(allowance)}")
    lines += [
        f"   Waiting {format_seconds(wait)}s before retry {retry}/{max_retries}"
        f" (attempt {attempt} of {total}) ...",
        RULE,
    ]
    return "\n".join(lines)


def _count(n: int, word: str) -> str:
    """``1 retry``, ``2 retries``, ``0 retries``."""
    if n == 1:
        return f"1 {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def exhausted_message(
    label: str,
    retries: int,
    *,
    attempts: int | None = None,
    kind: Kind = Kind.TEMPORARY,
    agent_retries: int = 0,
) -> str:
    """The error printed when the limit outlasted every retry (exit 75).

    ``attempts`` is ``retries + 1`` unless the step also ran once after a
    usage limit's reset (``--wait-for-reset``).  ``kind`` is what was read
    last: an overloaded provider is named as such, not as a rate limit.
    ``agent_retries`` are the retries the agent made by itself, which spent
    the same budget.

    >>> print(exhausted_message("claude", 0))  # doctest: +ELLIPSIS
    Error: claude rate limit persisted after 0 retries (1 attempt total).
    The provider kept throttling this step. ...
    """
    total = retries + 1 if attempts is None else attempts
    runs = f"{_count(retries, 'retry')} ({_count(total, 'attempt')} total"
    if agent_retries:
        runs += f", and {_count(agent_retries, 'retry')} by {label} itself"
    runs += ")"
    if kind is Kind.OVERLOAD:
        head = f"Error: {label} stayed overloaded after {runs}."
        why = "The provider stayed over capacity (not your limit)."
    else:
        head = f"Error: {label} rate limit persisted after {runs}."
        why = "The provider kept throttling this step."
    return (
        f"{head}\n{why} Increase RATELOOP_MAX_RETRIES\n"
        "or RATELOOP_BASE_DELAY_SECS, or retry later."
    )


def period_quota_message(
    label: str,
    *,
    signal: str,
    reset_at: datetime | None,
    now: datetime,
    allowance: str | None = None,
) -> str:
    """The error printed for a usage/quota window that will not reopen soon (exit 75).

    ``allowance`` (which allowance ran out, as the agent named it) is named
    when known; the reset is only ever the one the agent or provider stated.
    """
    head = f'Error: {label} hit a usage limit (signal: "{signal}"); not retrying in this run.'
    if allowance:
        head += f"\n{allowance_line(allowance)}"
    if reset_at is None:
        return f"{head}\nThe provider did not say when it resets; retry later."
    left = max(0.0, (reset_at - now).total_seconds())
    return (
        f"{head}\nThe limit resets at {reset_at.isoformat(timespec='seconds')}"
        f" (in {human_duration(left)}); retry after that."
    )


def human_duration(seconds: float) -> str:
    """A wait rounded up to the minute: ``3h 0m``, ``1d 2h``, ``5m``.

    >>> human_duration(3 * 3600), human_duration(61), human_duration(90000)
    ('3h 0m', '2m', '1d 1h')
    """
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


def reset_banner(
    *,
    label: str,
    signal: str,
    reset_at: datetime,
    now: datetime,
    limit: float,
    allowance: str | None = None,
    note: str | None = None,
) -> str:
    """The banner printed before waiting for a usage limit's reset (``--wait-for-reset``).

    >>> from datetime import UTC
    >>> print(reset_banner(label="claude", signal="usage limit reached", limit=6 * 3600,
    ...                    reset_at=datetime(2026, 1, 1, 15, tzinfo=UTC),
    ...                    now=datetime(2026, 1, 1, 12, tzinfo=UTC)))  # doctest: +ELLIPSIS
    ====...
    ⏳ USAGE LIMIT reached (signal: "usage limit reached")
       The limit resets at 2026-01-01T15:00:00+00:00 (in 3h 0m).
       Waiting for the reset (--wait-for-reset, up to 6h 0m), then running claude once more ...
    ====...
    """
    left = max(0.0, (reset_at - now).total_seconds())
    lines = [RULE, f'⏳ USAGE LIMIT reached (signal: "{signal}")']
    if allowance:
        lines.append(f"   {allowance_line(allowance)}")
    lines.append(
        f"   The limit resets at {reset_at.isoformat(timespec='seconds')}"
        f" (in {human_duration(left)})."
    )
    if note:
        lines.append(f"   {note}")
    lines += [
        f"   Waiting for the reset (--wait-for-reset, up to {human_duration(limit)}),"
        f" then running {label} once more ...",
        RULE,
    ]
    return "\n".join(lines)


def clock_duration(seconds: float) -> str:
    """A countdown's remaining time, rounded up to the second: ``2h 05m 09s``, ``4m 02s``, ``7s``.

    >>> clock_duration(7525.2), clock_duration(242), clock_duration(0.4)
    ('2h 05m 26s', '4m 02s', '1s')
    """
    total = math.ceil(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


#: Off a terminal, a long wait is slept in chunks of this many seconds so that the wall
#: clock is checked again (a laptop that slept through the reset time wakes up and runs).
WAIT_CHUNK_SECS = 60.0


def wait_until(clock: Clock, until: datetime, stream: TextIO) -> None:
    """Sleep on ``clock`` until its wall time reaches ``until``; a countdown on a terminal.

    The remaining time is recomputed from ``clock.now()`` before every sleep,
    so a suspended machine does not oversleep the reset by the time it was
    suspended.  Off a terminal nothing is printed (the banner said it all).
    """
    tty = is_terminal(stream)
    step = 1.0 if tty else WAIT_CHUNK_SECS
    width = 0
    # Under a millisecond left is "there": float rounding must not add a 1 µs sleep.
    while (left := (until - clock.now()).total_seconds()) > 0.001:
        if tty:
            line = f"\r   running again in {clock_duration(left)} ..."
            width = max(width, len(line))
            stream.write(line.ljust(width))
            stream.flush()
        clock.sleep(min(step, left))
    if tty and width:
        stream.write("\r" + " " * width + "\r")
        stream.flush()
