"""Reset times as CLI agents print them, read from lowercase text.

How it works: agents print a local wall-clock time, sometimes a date, and
sometimes the time zone in parentheses:

* Claude Code: ``resets 3:30am (Asia/Calcutta)``, ``resets 3pm``,
  ``resets Jan 30, 11:30am (Asia/Calcutta)``, ``resets May 5 at 9pm
  (America/New_York)``, ``resets Oct 31, 9am``, ``resets Oct 24``, ``Your
  limit resets at 3:00 PM``;
* Codex: ``try again at 3:28 PM`` (today) or ``try again at Jul 5th, 2026
  8:19 PM`` (formatted in the machine's local zone), also wrapped over two
  lines by the terminal;
* dates of monthly and weekly plans (:func:`date_reset`): Copilot's ``reset on
  April 20, 2026 at 2:00 AM`` and ``wait until January 17, 2025``, Cursor's
  ``monthly cycle ends on 11/17/2025``, Amazon Q's ``reset on 08/01``
  (month/day, as these US services print it).

A time without a date is the next such moment after ``now``; a date without
a year is the next such date (this year, or next year once it has passed).
The zone is the one printed, else ``tz`` (the machine's local zone by
default: the agent formatted the time there).  Zone names arrive lowercased
and are matched case-insensitively.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo
from functools import cache, lru_cache

from rateloop.classify._phrases import find_all

__all__ = ["at_reset", "clock_reset", "date_reset", "local_zone", "zone_named"]

_MONTHS = {
    name: index
    for index, names in enumerate(
        (("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"),
         ("may",), ("jun", "june"), ("jul", "july"), ("aug", "august"),
         ("sep", "sept", "september"), ("oct", "october"), ("nov", "november"),
         ("dec", "december")),
        start=1,
    )
    for name in names
}
_MONTH = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"  # noqa: E501
_TIME = r"(\d{1,2})(?::(\d{2}))?\s?(am|pm|a\.m\.|p\.m\.)?"
_ZONE = r"(?:\s?\(([a-z][a-z0-9_+/-]{1,40})\))?"
# "resets 3pm", "resets at 3:00 pm", "reset at 11pm (europe/paris)",
# "resets jan 30, 11:30am (asia/calcutta)", "resets may 5 at 9pm", "resets oct 24".
_CLOCK = re.compile(
    rf"resets?(?: at| on)? (?:{_MONTH}\.? (\d{{1,2}})(?:st|nd|rd|th)?,?(?: at)? ?)?"
    rf"(?:{_TIME})?{_ZONE}"
)
# Codex: "try again at 3:28 pm." / "try again at jul 5th, 2026 8:19 pm".
# Each space may be a line break: Codex's TUI wraps its message at the
# terminal's width ("… or try again at Jul 5th, 2026\n8:19 PM.").
_AT = re.compile(
    rf"try\sagain\sat\s(?:{_MONTH}\.?\s(\d{{1,2}})(?:st|nd|rd|th)?,?\s(\d{{4}}),?\s)?"
    rf"(\d{{1,2}}):(\d{{2}})\s?(am|pm)?"
)
# Copilot: "reset on april 20, 2026 at 2:00 am", "wait until january 17, 2025";
# Cursor: "monthly cycle ends on 11/17/2025"; Amazon Q: "reset on 08/01".
_DATE = re.compile(
    rf"(?:resets?\son|wait\suntil|cycle\sends\son)\s(?:{_MONTH}\.?\s(\d{{1,2}})(?:st|nd|rd|th)?"
    rf"(?:,?\s(\d{{4}}))?(?:,?\s(?:at\s)?(\d{{1,2}}):(\d{{2}})\s?(am|pm)?)?"
    rf"|(\d{{1,2}})/(\d{{1,2}})(?:/(\d{{4}}))?)"
)


@cache
def _zones_by_lower_name() -> dict[str, str]:
    from zoneinfo import available_timezones  # start-up time: only when asked

    return {name.lower(): name for name in available_timezones()}


@lru_cache(maxsize=256)  # bounded: zone names come from untrusted text
def zone_named(name: str) -> tzinfo | None:
    """The zone called ``name`` in any letter case (``asia/calcutta``), or ``None``."""
    if not name or len(name) > 64:
        return None
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # start-up time: only when asked

    guesses = [
        name,
        "/".join("_".join(p.capitalize() for p in part.split("_")) for part in name.split("/")),
        name.upper(),
    ]
    for guess in guesses:
        try:
            return ZoneInfo(guess)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            continue
    real = _zones_by_lower_name().get(name.lower())
    if real is None:
        return None
    try:
        return ZoneInfo(real)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # pragma: no cover - racing tzdata
        return None


def local_zone(now: datetime) -> tzinfo:
    """This machine's zone at ``now`` (what agents format their local times in)."""
    return now.astimezone().tzinfo or UTC


def _hour(hour_text: str | None, minute_text: str | None, meridiem: str | None) -> tuple[int, int] | None:  # noqa: E501
    if hour_text is None:
        return None
    hour, minute = int(hour_text), int(minute_text or 0)
    if meridiem:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if meridiem.startswith("p") else 0)
    if hour > 23 or minute > 59:
        return None
    return hour, minute


def _next(
    now: datetime, zone: tzinfo, *, month: int | None, day: int | None, year: int | None,
    hour: int, minute: int,
) -> datetime | None:
    local = now.astimezone(zone)
    try:
        if month is None or day is None:
            candidate = datetime(local.year, local.month, local.day, hour, minute, tzinfo=zone)
            if candidate <= local:
                tomorrow = local.date() + timedelta(days=1)
                candidate = datetime(
                    tomorrow.year, tomorrow.month, tomorrow.day, hour, minute, tzinfo=zone
                )
        elif year is not None:
            candidate = datetime(year, month, day, hour, minute, tzinfo=zone)
        else:
            candidate = datetime(local.year, month, day, hour, minute, tzinfo=zone)
            if candidate < local - timedelta(days=1):
                candidate = datetime(local.year + 1, month, day, hour, minute, tzinfo=zone)
    except (ValueError, OverflowError):
        return None
    return candidate.astimezone(UTC)


def clock_reset(low: str, now: datetime, tz: tzinfo | None = None) -> datetime | None:
    """The last "resets <date/time> (<zone>)" in lowercase ``low``, as an aware UTC time.

    The last one: an agent that is asked again prints the limit again, with
    the reset as it stands now.  A bare hour needs am/pm or minutes ("resets 3"
    is not a time); a date alone means midnight.  ``None`` when nothing in
    ``low`` reads as a reset time.
    """
    tail = low[-_TAIL:]
    found = _last_clock(tail, now, tz)
    if found is None and len(low) > _TAIL:
        found = _last_clock(low, now, tz)
    return found


#: The last reset is looked for in the last few thousand characters first.
_TAIL = 4_000


def _last_clock(low: str, now: datetime, tz: tzinfo | None) -> datetime | None:
    found: datetime | None = None
    for match in find_all(_CLOCK, low):
        month_name, day_text, hour_text, minute_text, meridiem, zone_name = match.groups()
        month = _MONTHS.get(month_name or "")
        if hour_text is not None and meridiem is None and minute_text is None:
            if month is None:
                continue
            hour_minute: tuple[int, int] | None = None
        else:
            hour_minute = _hour(hour_text, minute_text, meridiem)
        if hour_minute is None and month is None:
            continue
        hour, minute = hour_minute or (0, 0)
        zone = zone_named(zone_name) if zone_name else None
        moment = _next(
            now, zone or tz or local_zone(now), month=month,
            day=int(day_text) if day_text else None, year=None, hour=hour, minute=minute,
        )
        found = moment or found
    return found


def at_reset(low: str, now: datetime, tz: tzinfo | None = None) -> datetime | None:
    """Codex's "try again at 3:28 pm" / "try again at jul 5th, 2026 8:19 pm"."""
    for match in find_all(_AT, low):
        month_name, day_text, year_text, hour_text, minute_text, meridiem = match.groups()
        hour_minute = _hour(hour_text, minute_text, meridiem)
        if hour_minute is None:
            continue
        month = _MONTHS.get(month_name or "")
        moment = _next(
            now, tz or local_zone(now), month=month,
            day=int(day_text) if day_text else None,
            year=int(year_text) if year_text else None,
            hour=hour_minute[0], minute=hour_minute[1],
        )
        if moment is not None:
            return moment
    return None


def date_reset(low: str, now: datetime, tz: tzinfo | None = None) -> datetime | None:
    """The first "reset on <date> [at <time>]" / "wait until <date>" / "cycle ends on
    <m>/<d>[/<y>]" in lowercase ``low``, as an aware UTC time (midnight when no time
    is printed), or ``None``.  A date without a year is its next occurrence."""
    for match in find_all(_DATE, low):
        (month_name, day_text, year_text, hour_text, minute_text, meridiem,
         month_num, day_num, year_num) = match.groups()
        if month_name is not None:
            month, day, year = _MONTHS.get(month_name), day_text, year_text
        else:
            month, day, year = int(month_num), day_num, year_num
        hour_minute = _hour(hour_text, minute_text, meridiem) if hour_text else (0, 0)
        if month is None or not 1 <= month <= 12 or hour_minute is None:
            continue
        moment = _next(
            now, tz or local_zone(now), month=month, day=int(day), year=int(year) if year else None,
            hour=hour_minute[0], minute=hour_minute[1],
        )
        if moment is not None:
            return moment
    return None
