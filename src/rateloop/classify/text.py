"""Read the output of a CLI agent (Claude Code, Copilot CLI, Codex, Gemini CLI).

How it works: exit code 0 is always ``ok``.  Otherwise the text (ANSI colour
codes removed) is asked, in this order:

1. Is it a **usage or quota limit** with a far reset?  Claude Code's
   ``Claude AI usage limit reached|<epoch>`` and ``5-hour limit reached ∙
   resets 3pm (America/New_York)``, Codex's ``You've hit your usage limit …
   try again in 4 days 1 hour``, Gemini CLI's ``Quota exceeded for quota
   metric … per day``.  These are ``period_quota`` with ``reset_at`` (when
   the text says): a usage allowance is not a short throttle, whatever the
   clock says.
2. Is it **spend** (billing, credit, "exceeded your current quota")?
3. Is it a **rate limit**?  The five signals of the recipe runner —
   "hit your rate limit", "too many requests", "rate limit" (also
   ``rate-limit``, ``RateLimitError``, ``ratelimited``), a standalone ``429``
   and the phrase "reset in" — plus "resource exhausted" and "throttled".  A
   rate limit naming a day window ("requests per day (RPD)") is
   ``period_quota``; otherwise ``temporary`` with any stated wait ("try again
   in 20s", "reset in 30 seconds").
4. Else overload, permission, network or server error phrases; else ``unknown``.

Matching respects word boundaries: "preset installed" has no "reset in",
"processed 14290 files" has no 429.  ``matched`` is the canonical lowercase
phrase, e.g. ``"hit your rate limit"``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rateloop.classify._core import resolve_now
from rateloop.classify._phrases import dimension_of, period_of, spend_of, wait_in
from rateloop.classify._time import add_seconds, reset_value
from rateloop.classify.google import next_pacific_midnight
from rateloop.signal import Kind, LimitSignal

__all__ = ["classify_text"]

_MAX_TEXT = 200_000
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
_SPACES = re.compile(r"\s+")

_CLAUDE_EPOCH = re.compile(r"claude ai usage limit reached\s*\|\s*(\d{9,14})", re.IGNORECASE)
_USAGE = re.compile(
    r"\b(?:\d+[- ]hour|weekly|daily|session|opus|sonnet|usage|plan)\s+limit\s+"
    r"(?:reached|exceeded|hit)\b",
    re.IGNORECASE,
)
_CODEX = re.compile(r"\b(?:you've|you have|you)\s+hit\s+your\s+usage\s+limit\b", re.IGNORECASE)
_GEMINI_QUOTA = re.compile(
    r"\bquota exceeded for quota metric\s+'([^']*)'(?:\s+and limit\s+'([^']*)')?", re.IGNORECASE
)
_DAILY_QUOTA = re.compile(r"\bexhausted your daily quota\b", re.IGNORECASE)
_CLOCK = re.compile(
    r"\breset(?:s)?\s+(?:at\s+)?(\d{1,2})(?::(\d{2}))?\s*(am|pm|a\.m\.|p\.m\.)?"
    r"(?:\s*\(([^)\s]+)\))?",
    re.IGNORECASE,
)
_AT_DATE = re.compile(
    r"\btry again at\s+([A-Za-z]{3,9})\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4}),?\s+"
    r"(\d{1,2}):(\d{2})\s*([AP]M)?",
    re.IGNORECASE,
)

_RATE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), canonical)
    for pattern, canonical in (
        (r"\bhit your rate[\s_-]?limit", "hit your rate limit"),
        (r"\btoo many requests\b", "too many requests"),
        (r"\brate[\s_-]?limit", "rate limit"),
        (r"(?<![\w.])(?<!line )429(?![\w.])(?!:\d)", "429"),
        (r"\breset in\b", "reset in"),
        (r"\bresource[\s_-]?exhausted\b", "resource exhausted"),
        (r"\bthrottl(?:ed|ing)", "throttled"),
    )
)
_OTHER: tuple[tuple[re.Pattern[str], str, Kind], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), canonical, kind)
    for pattern, canonical, kind in (
        (r"\boverloaded(?:_error)?\b", "overloaded", Kind.OVERLOAD),
        (r"(?<![\w.])529(?![\w.])", "529", Kind.OVERLOAD),
        (r"\bauthentication (?:failed|error|required)\b", "authentication failed",
         Kind.PERMISSION),
        (r"\bunauthori[sz]ed\b", "unauthorized", Kind.PERMISSION),
        (r"\binvalid (?:api[ _-]?key|x-api-key|bearer token|token)\b", "invalid api key",
         Kind.PERMISSION),
        (r"\bnot logged in\b|\bplease run /login\b", "not logged in", Kind.PERMISSION),
        (r"(?<![\w.])40[13](?![\w.])", "401", Kind.PERMISSION),
        (r"\beconnreset\b|\bconnection reset\b", "connection reset", Kind.NETWORK),
        (r"\betimedout\b|\bconnection timed out\b|\brequest timed out\b", "timed out",
         Kind.NETWORK),
        (r"\beconnrefused\b|\bconnection refused\b", "connection refused", Kind.NETWORK),
        (r"\bsocket hang up\b|\bnetwork error\b|\bfetch failed\b|\benotfound\b",
         "network error", Kind.NETWORK),
        (r"\binternal server error\b|\bbad gateway\b|\bservice unavailable\b|"
         r"\bgateway timeout\b|\b(?:http|status|api error:?)\s*50[0234]\b",
         "server error", Kind.SERVER_ERROR),
    )
)
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


def _clean(text: str) -> str:
    if len(text) > _MAX_TEXT:
        text = text[: _MAX_TEXT // 2] + "\n" + text[-_MAX_TEXT // 2 :]
    return _ANSI.sub("", text)


def _canonical(phrase: str) -> str:
    return _SPACES.sub(" ", phrase.strip().lower())


def _zone(name: str | None) -> ZoneInfo | None:
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _clock_reset(text: str, now: datetime) -> datetime | None:
    """"resets 3pm (America/New_York)" → the next such moment after ``now`` (UTC by default)."""
    for match in _CLOCK.finditer(text):
        hour_text, minute_text, meridiem, zone_name = match.groups()
        if meridiem is None and minute_text is None:
            continue
        hour, minute = int(hour_text), int(minute_text or 0)
        if meridiem:
            if not 1 <= hour <= 12:
                continue
            hour = hour % 12 + (12 if meridiem.lower().startswith("p") else 0)
        if hour > 23 or minute > 59:
            continue
        zone = _zone(zone_name) or UTC
        local = now.astimezone(zone)
        candidate = datetime(local.year, local.month, local.day, hour, minute, tzinfo=zone)
        if candidate <= local:
            day = local.date() + timedelta(days=1)
            candidate = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
        return candidate.astimezone(UTC)
    return None


def _date_reset(text: str) -> datetime | None:
    """Codex's "try again at Jul 5th, 2026 8:19 PM" (taken as UTC)."""
    match = _AT_DATE.search(text)
    if not match:
        return None
    month = _MONTHS.get(match.group(1).lower())
    hour, minute = int(match.group(4)), int(match.group(5))
    if match.group(6):
        hour = hour % 12 + (12 if match.group(6).upper() == "PM" else 0)
    if month is None:
        return None
    try:
        return datetime(int(match.group(3)), month, int(match.group(2)), hour, minute, tzinfo=UTC)
    except ValueError:
        return None


def _limit(matched: str, reset_at: datetime | None, provider: str | None) -> LimitSignal:
    return LimitSignal.of(
        Kind.PERIOD_QUOTA, reset_at=reset_at, matched=matched, provider=provider
    )


def _usage_limit(text: str, now: datetime) -> LimitSignal | None:
    epoch = _CLAUDE_EPOCH.search(text)
    if epoch:
        _, reset_at = reset_value(epoch.group(1), now)
        return _limit("usage limit reached", reset_at, "anthropic")
    codex = _CODEX.search(text)
    if codex:
        wait = wait_in(text)
        reset_at = add_seconds(now, wait) if wait is not None else _date_reset(text)
        return _limit("hit your usage limit", reset_at, "openai")
    usage = _USAGE.search(text)
    if usage:
        reset_at = _clock_reset(text, now)
        if reset_at is None:
            reset_at = add_seconds(now, wait_in(text))
        return _limit(_canonical(usage.group(0)), reset_at, None)
    gemini = _GEMINI_QUOTA.search(text)
    if gemini:
        period = period_of(" ".join(g or "" for g in gemini.groups()))
        if period is not None:
            reset_at = next_pacific_midnight(now) if "day" in period[0] else None
            return LimitSignal.of(
                Kind.PERIOD_QUOTA, reset_at=reset_at, matched="quota exceeded",
                dimension=period[1], provider="google",
            )
        return LimitSignal.of(
            Kind.TEMPORARY, retry_after=wait_in(text), matched="quota exceeded",
            dimension=dimension_of(text), provider="google",
        )
    if _DAILY_QUOTA.search(text):
        return LimitSignal.of(
            Kind.PERIOD_QUOTA, reset_at=next_pacific_midnight(now),
            matched="exhausted your daily quota", provider="google",
        )
    return None


def _rate_limit(text: str) -> LimitSignal | None:
    for pattern, canonical in _RATE:
        if pattern.search(text):
            period = period_of(text)
            if period is not None:
                return LimitSignal.of(
                    Kind.PERIOD_QUOTA, matched=canonical, dimension=period[1]
                )
            return LimitSignal.of(
                Kind.TEMPORARY,
                retry_after=wait_in(text),
                matched=canonical,
                dimension=dimension_of(text),
            )
    return None


def classify_text(
    text: str, *, exit_code: int | None = None, now: datetime | None = None
) -> LimitSignal:
    """Classify a CLI agent's output; exit code 0 is always ``ok``.

    Never raises on any text; waits are within [0, 86400] seconds.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise TypeError(f"exit_code must be an int or None, got {exit_code!r}")
    moment = resolve_now(now)
    if exit_code == 0:
        return LimitSignal.of(Kind.OK)
    cleaned = _clean(text)
    signal = _usage_limit(cleaned, moment)
    if signal is not None:
        return signal
    spend = spend_of(cleaned)
    if spend is not None:
        return LimitSignal.of(Kind.SPEND, matched=spend)
    signal = _rate_limit(cleaned)
    if signal is not None:
        return signal
    for pattern, canonical, kind in _OTHER:
        match = pattern.search(cleaned)
        if match:
            matched = canonical if canonical != "401" else match.group(0)
            return LimitSignal.of(kind, matched=matched)
    return LimitSignal.of(Kind.UNKNOWN)
