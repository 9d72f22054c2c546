"""What each CLI agent prints when it is refused, read from lowercase text.

Every recognizer takes the cleaned, lowercased output and returns a
:class:`Reading` or ``None``; :mod:`rateloop.classify.text` asks them in
order, then falls back to the generic phrases.  The strings, and where they
come from (each agent's source or its public issue threads), are listed in
``docs/classify.md``; ``tests/fixtures/classify/agents_*.yaml`` holds one
fixture per message with its source.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo

from rateloop.classify import _allowance as allowance
from rateloop.classify._agent_others import OTHER_AGENT_READERS
from rateloop.classify._phrases import dimension_of, find, find_all, period_of, wait_in
from rateloop.classify._reading import Reader, Reading
from rateloop.classify._time import reset_value
from rateloop.classify._when import at_reset, clock_reset, date_reset
from rateloop.classify.google import next_pacific_midnight
from rateloop.signal import Kind

__all__ = ["AGENT_READERS", "Reading"]


# --- Claude Code -------------------------------------------------------------

_CLAUDE_EPOCH = re.compile(r"claude ai usage limit reached\s?\|\s?(\d{9,14})")
_CLAUDE_SPEND = re.compile(
    r"hit your (?:extra usage |monthly |org(?:anization)?(?:'s|’s)? )?spend(?:ing)? limit"
    r"|out of extra usage\b"
)
_CLAUDE_LIMIT = re.compile(
    r"hit your (?:(session|weekly|opus|sonnet|daily|5-hour|usage|org(?:anization)?(?:'s|’s)?) )?"
    r"limit\b"
)
# Literal first ("limit reached"), the word before it checked on a short slice:
# an alternation in front would be tried at every character.
_LIMIT_REACHED = re.compile(r"limit (?:reached|exceeded|hit)\b")
_LIMIT_WHICH = re.compile(r"(?:\d{1,2}[- ]hour|session|weekly|daily|opus|sonnet|usage|plan) $")
_TAIL = 4_000
_RETRYING = re.compile(
    r"retrying in (\d{1,7}(?:\.\d{1,6})?) ?(?:seconds?|secs?|s)\b"
    r"[^\n]{0,24}?attempt \d{1,3}/\d{1,3}"
)


def _claude_epoch(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    found = find(_CLAUDE_EPOCH, low)
    if found is None:
        return None
    _, reset_at = reset_value(found.group(1), now)
    return Reading(Kind.PERIOD_QUOTA, "usage limit reached", "anthropic", reset_at=reset_at)


def _claude_spend(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    found = find(_CLAUDE_SPEND, low)
    if found is None:
        return None
    # "You're out of extra usage · resets 9pm": the usage credits (extra usage) are
    # spent; "hit your monthly spend limit": the cap set on the account.
    if found.group(0).startswith("out of"):
        matched, code = "out of extra usage", allowance.CREDITS
    else:
        matched, code = "spend limit", allowance.SPEND_LIMIT
    # "You've hit your extra usage spend limit ∙ Your limit resets at 3:00 PM": the
    # plan's own window returns at the reset; without one a person must raise the cap.
    reset_at = clock_reset(low, now, tz)
    if reset_at is not None:
        return Reading(Kind.PERIOD_QUOTA, matched, "anthropic", reset_at=reset_at, code=code)
    return Reading(Kind.SPEND, matched, "anthropic", code=code)


# The word before "limit" names the allowance: "hit your weekly limit", "Opus weekly
# limit reached", "5-hour limit reached".  "usage", "plan" or nothing name none.
_WHICH_CODE = (
    ("hour", allowance.SESSION), ("session", allowance.SESSION),
    ("weekly", allowance.WEEKLY), ("daily", allowance.DAILY),
    ("opus", allowance.MODEL), ("sonnet", allowance.MODEL),
)
_MODEL_BEFORE = re.compile(r"(?:opus|sonnet) $")


def _which_code(which: str, low: str, start: int) -> str | None:
    code = next((code for word, code in _WHICH_CODE if word in which), None)
    if code == allowance.WEEKLY and _MODEL_BEFORE.search(low, max(0, start - 7), start):
        return allowance.MODEL_WEEKLY
    return code


def _claude_limit(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    found = find(_CLAUDE_LIMIT, low)
    if found is None:
        return None
    which = f"{found.group(1)} limit" if found.group(1) else "limit"
    code = _which_code(found.group(1) or "", low, found.start(1))
    reset_at = clock_reset(low, now, tz)
    if reset_at is None:
        wait = wait_in(low)
        return Reading(Kind.PERIOD_QUOTA, f"hit your {which}", "anthropic", wait=wait,
                       code=code)
    return Reading(Kind.PERIOD_QUOTA, f"hit your {which}", "anthropic", reset_at=reset_at,
                   code=code)


def _limit_reached(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    phrase = None
    for match in find_all(_LIMIT_REACHED, low):
        which = _LIMIT_WHICH.search(low, max(0, match.start() - 8), match.start())
        if which is not None:
            phrase = which.group(0) + match.group(0)
            code = _which_code(which.group(0), low, which.start())
            break
    if phrase is None:
        return None
    own = ("hour", "session", "weekly", "opus", "sonnet")
    claude = "claude" in low or (any(word in phrase for word in own) and "codex" not in low)
    provider = "anthropic" if claude else None
    reset_at = clock_reset(low, now, tz)
    if reset_at is None:
        return Reading(Kind.PERIOD_QUOTA, " ".join(phrase.split()), provider,
                       wait=wait_in(low), code=code)
    return Reading(Kind.PERIOD_QUOTA, " ".join(phrase.split()), provider,
                   reset_at=reset_at, code=code)


def _claude_retrying(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    """``API Error (429 …) · Retrying in 5 seconds… (attempt 3/10)``: the last such line."""
    tail = low[-_TAIL:]
    matches = list(find_all(_RETRYING, tail)) or list(find_all(_RETRYING, low))
    if not matches:
        return None
    if matches[-1].string is tail:
        low = tail
    last = matches[-1]
    start = low.rfind("\n", 0, last.start()) + 1
    line = low[start : last.start()]
    wait = float(last.group(1))
    if "429" in line or "rate limit" in line or "rate_limit" in line:
        kind, matched = Kind.TEMPORARY, "api error 429 retrying"
    elif "529" in line or "overloaded" in line:
        kind, matched = Kind.OVERLOAD, "api error 529 retrying"
    elif "connection" in line or "fetch failed" in line or "timed out" in line:
        kind, matched = Kind.NETWORK, "api error connection retrying"
    elif "500" in line or "502" in line or "503" in line or "504" in line:
        kind, matched = Kind.SERVER_ERROR, "api error 5xx retrying"
    else:
        kind, matched = Kind.SERVER_ERROR, "api error retrying"
    return Reading(kind, matched, "anthropic", wait=wait)


# --- Codex -------------------------------------------------------------------

# \s: a wrapped line.  "reached": the Codex app's "You've reached your usage limit. Upgrade
# your plan or add credits to continue".
_CODEX_LIMIT = re.compile(r"(?:hit|reached)\syour\susage\slimit\b")
_CODEX_MARKS = ("codex", "chatgpt", "openai.com", "try again at", "try again in",
                "send a request to your admin", "purchase more credits", "upgrade to plus",
                "upgrade to pro", "add credits to continue")
_CODEX_NOT_INCLUDED = re.compile(r"to use codex with your chatgpt plan, upgrade to plus")
_HIGH_DEMAND = re.compile(r"experiencing high demand\b")
_USAGE_LIMIT_JSON = re.compile(r"usage_limit_reached\b")
_RESETS_IN = re.compile(r"\"resets_in_seconds\"\s?:\s?(\d{1,12})")
_RESETS_AT = re.compile(r"\"resets_at\"\s?:\s?(\d{9,13})")


def _is_codex(low: str) -> bool:
    return any(mark in low for mark in _CODEX_MARKS)


def _codex_limit(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    found = find(_CODEX_LIMIT, low)
    if found is None:
        return None
    matched = " ".join(found.group(0).split())
    provider = "openai" if _is_codex(low) else None
    wait = wait_in(low)
    if wait is not None:
        return Reading(Kind.PERIOD_QUOTA, matched, provider, wait=wait)
    return Reading(Kind.PERIOD_QUOTA, matched, provider,
                   reset_at=at_reset(low, now, tz) or clock_reset(low, now, tz))


def _codex_json(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    if find(_USAGE_LIMIT_JSON, low) is None:
        return None
    seconds = _RESETS_IN.search(low)
    if seconds is not None:
        return Reading(Kind.PERIOD_QUOTA, "usage_limit_reached", "openai",
                       wait=float(seconds.group(1)))
    epoch = _RESETS_AT.search(low)
    reset_at = reset_value(epoch.group(1), now)[1] if epoch else None
    return Reading(Kind.PERIOD_QUOTA, "usage_limit_reached", "openai", reset_at=reset_at)


def _codex_fixed(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    if find(_CODEX_NOT_INCLUDED, low) is not None:
        # The plan does not include Codex: an operator must change the plan.
        return Reading(Kind.SPEND, "usage not included in plan", "openai")
    if find(_HIGH_DEMAND, low) is not None:
        # Codex prints this for every 500 from its backend.
        return Reading(Kind.OVERLOAD, "high demand", "openai" if "codex" in low else None)
    return None


# --- GitHub Copilot ------------------------------------------------------------

_PREMIUM = re.compile(r"exceeded your premium (?:model )?request allowance\b")
_NO_QUOTA = re.compile(r"you have no quota\b|\"quota_exceeded\"")
_COPILOT_LIMIT = re.compile(r"hit a rate limit that restricts the number of copilot")
_COPILOT_RESET = re.compile(r"hit your rate limit\. please wait for your limit to reset")


def _first_of_next_month(now: datetime) -> datetime:
    moment = now.astimezone(UTC)
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


# The allowances behind Copilot's 429s (its codes user_weekly_rate_limited and
# user_global_rate_limited:<plan>); \s: the terminal may wrap at any space.  The
# message may still say "Please wait 2 minutes before trying again": that wait is
# not when the allowance returns.
_COPILOT_ALLOWANCE: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"(?:reached|exceeded)\syour\sweekly\srate\slimit\b"
                r"|user_weekly_rate_limited\b"), "weekly rate limit", allowance.WEEKLY),
    (re.compile(r"exceeded\syour\s5\shour\ssession\slimits?\b"), "5 hour session limit",
     allowance.SESSION),
    (re.compile(r"reached\syour\smonthly\schat\smessages\s(?:limit|quota)\b"),
     "monthly chat messages limit", allowance.MONTHLY),
)


# "Sorry, you have exhausted this model's rate limit. Please wait a moment before trying
# again, or switch to a different model.": a short limit on one model (another may pass).
_COPILOT_MODEL = re.compile(r"exhausted\sthis\smodel(?:'|’)s\srate\slimit\b")


def _copilot_allowance(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    if find(_COPILOT_MODEL, low) is not None:
        return Reading(Kind.TEMPORARY, "model's rate limit", "github", wait=wait_in(low),
                       code=allowance.MODEL)
    for pattern, matched, code in _COPILOT_ALLOWANCE:
        if find(pattern, low) is not None:
            # "reset on April 20, 2026 at 2:00 AM", "wait until January 17, 2025";
            # no date printed, no reset invented.
            return Reading(Kind.PERIOD_QUOTA, matched, "github",
                           reset_at=date_reset(low, now, tz), code=code)
    return None


def _copilot(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    if find(_PREMIUM, low) is not None:
        # Premium-request allowances are monthly and reset on the 1st at 00:00 UTC.
        return Reading(Kind.PERIOD_QUOTA, "premium request allowance", "github",
                       reset_at=_first_of_next_month(now), code=allowance.MONTHLY)
    if find(_NO_QUOTA, low) is not None and ("402" in low or "copilot" in low):
        return Reading(Kind.SPEND, "no quota", "github")
    if find(_COPILOT_LIMIT, low) is not None:
        return Reading(Kind.TEMPORARY, "copilot rate limit", "github", wait=wait_in(low))
    if find(_COPILOT_RESET, low) is not None:
        return Reading(Kind.TEMPORARY, "hit your rate limit", "github", wait=wait_in(low))
    return None


# --- Gemini CLI ---------------------------------------------------------------

_CAPACITY = re.compile(r"exhausted your capacity on this model\b")
_QUOTA_METRIC = re.compile(r"quota exceeded for quota metric '([^'\n]{0,200})'"
                           r"(?: and limit '([^'\n]{0,200})')?")
_DAILY_QUOTA = re.compile(r"exhausted your daily quota\b|reached your daily\s[\s\S]{0,60}?quota")
_GOOGLE_QUOTA = re.compile(r"exceeded your current quota\b")
_GOOGLE_MARKS = ("googleapis.com", "ai.google.dev", "generativelanguage", "gemini")
_DAILY_MODEL = re.compile(r"daily quota on this model|daily\s[a-z0-9.-]{1,40}\squota")
_NO_CAPACITY = re.compile(r"no capacity available for model\b")
# "Usage limit reached for all Pro models." / "Usage limit reached for gemini-2.5-flash-lite."
_MODEL_USAGE = re.compile(
    r"usage limit reached for (all [a-z0-9.-]{1,20} models|[a-z][a-z0-9.-]{0,60}[a-z0-9])"
)
# After a fallback notice the request in flight is refused once; the next one runs on Flash.
_FLASH_CONTINUE = re.compile(r"please submit a new query to continue with the flash model")


def _gemini_model(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    found = find(_MODEL_USAGE, low)
    if found is not None:
        return Reading(Kind.PERIOD_QUOTA, f"usage limit reached for {found.group(1)}", "google",
                       reset_at=clock_reset(low, now, tz), code=allowance.MODEL)
    if find(_FLASH_CONTINUE, low) is not None:
        return Reading(Kind.TEMPORARY, "model fallback", "google")
    return None


def _gemini(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    if find(_CAPACITY, low) is not None:
        return Reading(Kind.TEMPORARY, "exhausted your capacity", "google", wait=wait_in(low))
    metric = find(_QUOTA_METRIC, low)
    if metric is not None:
        period = period_of(" ".join(g or "" for g in metric.groups()))
        if period is not None:
            reset_at = next_pacific_midnight(now) if "day" in period[0] else None
            return Reading(Kind.PERIOD_QUOTA, "quota exceeded", "google", reset_at=reset_at,
                           dimension=period[1])
        return Reading(Kind.TEMPORARY, "quota exceeded", "google", wait=wait_in(low),
                       dimension=dimension_of(low))
    if find(_DAILY_QUOTA, low) is not None:
        code = allowance.MODEL_DAILY if find(_DAILY_MODEL, low) else allowance.DAILY
        return Reading(Kind.PERIOD_QUOTA, "daily quota", "google",
                       reset_at=next_pacific_midnight(now), code=code)
    if find(_NO_CAPACITY, low) is not None:
        return Reading(Kind.OVERLOAD, "no capacity available", "google")
    if find(_GOOGLE_QUOTA, low) is not None and any(mark in low for mark in _GOOGLE_MARKS):
        # Google's sentence for every quota 429: which limit only the rest says.
        period = period_of(low)
        if period is not None:
            reset_at = next_pacific_midnight(now) if "day" in period[0] else None
            return Reading(Kind.PERIOD_QUOTA, "exceeded your current quota", "google",
                           wait=wait_in(low), reset_at=reset_at, dimension=period[1])
        return Reading(Kind.TEMPORARY, "exceeded your current quota", "google",
                       wait=wait_in(low), dimension=dimension_of(low))
    return None


#: In order: the first reader that recognizes the text decides.
AGENT_READERS: tuple[Reader, ...] = (
    _claude_epoch,
    _claude_spend,
    _copilot_allowance,
    *OTHER_AGENT_READERS,
    _codex_json,
    _codex_limit,
    _claude_limit,
    _gemini_model,
    _limit_reached,
    _codex_fixed,
    _copilot,
    _gemini,
    _claude_retrying,
)
