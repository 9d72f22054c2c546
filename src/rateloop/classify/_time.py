"""Turn the many ways providers write a time into seconds or an aware datetime.

How it works: every parser here takes untrusted text (or a number) and returns
``None`` instead of raising.  Durations come as Go-style strings (``6m0s``,
``2m59.56s``, ``120ms``, ``1h2m3s``), protobuf JSON durations (``"35s"``,
``"1.5s"``), or prose (``4 days 1 hour``, ``30 seconds``).  Instants come as
RFC 3339 / ISO 8601, HTTP-dates (RFC 9110) or epoch numbers.

:func:`reset_value` resolves a bare number with documented heuristics:

* above ``1e12`` it is epoch **milliseconds** (1e12 ms is September 2001);
* above ``1e9`` it is epoch **seconds** (1e9 s is September 2001);
* otherwise it is a **delta**: seconds, or milliseconds when the field name
  says so (``_ms`` / ``Ms``).

Every wait is clamped to [0, 86400] by :func:`rateloop.signal.clamp_wait`.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from rateloop.signal import clamp_wait

__all__ = [
    "EPOCH_MS_THRESHOLD",
    "EPOCH_S_THRESHOLD",
    "add_seconds",
    "parse_datetime",
    "parse_duration",
    "parse_number",
    "reset_value",
    "seconds_between",
    "seconds_until",
]

EPOCH_MS_THRESHOLD = 1e12
EPOCH_S_THRESHOLD = 1e9

_UNIT_SECONDS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "msecs": 1e-3,
    "millisecond": 1e-3,
    "milliseconds": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 604800.0,
    "week": 604800.0,
    "weeks": 604800.0,
}

# Longest units first so "ms" wins over "m" and "minutes" over "min".
_UNITS = "|".join(sorted((re.escape(u) for u in _UNIT_SECONDS), key=len, reverse=True))
_PART = re.compile(rf"(\d+(?:\.\d+)?|\.\d+)\s*({_UNITS})(?![a-zµ])", re.IGNORECASE)
_JOINERS = re.compile(r"^(?:[\s,]|and)*$", re.IGNORECASE)
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_MAX_TEXT = 256


def parse_number(value: object) -> float | None:
    """A finite float from an int, float or numeric string; else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value) if not isinstance(value, int) or abs(value) < 10**300 else None
    elif isinstance(value, str) and len(value) <= _MAX_TEXT and _NUMBER.match(value.strip()):
        try:
            number = float(value.strip())
        except (ValueError, OverflowError):
            return None
    else:
        return None
    if number is None or not math.isfinite(number):
        return None
    return number


def parse_duration(text: str) -> float | None:
    """Seconds in a duration like ``6m0s``, ``120ms``, ``1.5s`` or ``4 days 1 hour``.

    The whole string must be duration parts (separated by spaces, commas or
    "and"); a bare number is seconds.  Anything else is ``None``.
    """
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        return None
    stripped = text.strip().lower()
    if not stripped:
        return None
    bare = parse_number(stripped)
    if bare is not None:
        return bare
    total = 0.0
    position = 0
    found = False
    for match in _PART.finditer(stripped):
        if not _JOINERS.match(stripped[position : match.start()]):
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
        position = match.end()
        found = True
    if not found or not _JOINERS.match(stripped[position:]):
        return None
    return total if math.isfinite(total) else None


def parse_datetime(text: str) -> datetime | None:
    """An aware datetime from RFC 3339 / ISO 8601 or an HTTP-date; else ``None``.

    A naive ISO timestamp is taken as UTC.
    """
    if not isinstance(text, str) or len(text) > _MAX_TEXT:
        return None
    stripped = text.strip()
    if not stripped or not any(c.isdigit() for c in stripped):
        return None
    candidate = stripped[:-1] + "+00:00" if stripped[-1:] in ("Z", "z") else stripped
    try:
        parsed = datetime.fromisoformat(candidate)
    except ValueError:
        parsed = None
    if parsed is None:
        # email.utils (~5 ms with its email.* imports) only for the rare HTTP-date.
        from email.utils import parsedate_to_datetime

        try:
            parsed = parsedate_to_datetime(stripped)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if parsed is None:  # pragma: no cover - older Pythons returned None
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _from_epoch(seconds: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def seconds_until(moment: datetime, now: datetime) -> float | None:
    """The clamped wait from ``now`` until ``moment`` (0 when it has passed)."""
    try:
        return clamp_wait((moment - now).total_seconds())
    except (OverflowError, TypeError):
        return None


def seconds_between(moment: datetime, now: datetime) -> float | None:
    """``moment - now`` in seconds, unclamped (negative when it has passed)."""
    try:
        return (moment - now).total_seconds()
    except (OverflowError, TypeError):
        return None


def add_seconds(now: datetime, seconds: float | None) -> datetime | None:
    """``now + seconds``, or None when there are no seconds or the date would overflow."""
    if seconds is None:
        return None
    try:
        return now + timedelta(seconds=seconds)
    except (OverflowError, ValueError):
        return None


def reset_value(
    value: object, now: datetime, *, millis: bool = False
) -> tuple[float | None, datetime | None]:
    """Resolve a reset/retry value into ``(wait_seconds, reset_at)``.

    ``value`` may be a number (delta or epoch, see the module docstring), a
    numeric string, a duration string or a timestamp.  ``millis`` says a bare
    delta is in milliseconds.  Never raises; unknown input gives
    ``(None, None)``.
    """
    number = parse_number(value)
    if number is not None:
        if number >= EPOCH_MS_THRESHOLD:
            moment = _from_epoch(number / 1000.0)
        elif number >= EPOCH_S_THRESHOLD:
            moment = _from_epoch(number)
        else:
            delta = number / 1000.0 if millis else number
            wait = clamp_wait(delta)
            return wait, add_seconds(now, wait)
        if moment is None:
            return None, None
        return seconds_until(moment, now), moment
    if not isinstance(value, str):
        return None, None
    duration = parse_duration(value)
    if duration is not None:
        wait = clamp_wait(duration)
        return wait, add_seconds(now, wait)
    moment = parse_datetime(value)
    if moment is None:
        return None, None
    return seconds_until(moment, now), moment
