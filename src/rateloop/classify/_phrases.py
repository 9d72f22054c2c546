"""Phrases that decide a refusal's kind, shared by the HTTP and CLI-text readers.

The order of questions is the rule that matters most: can the request
**never fit** its limit (``Limit 30000, Requested 45000``: ``invalid``)?  Is
it **spend** (billing, credit, "exceeded your current quota")?  Else is it a
spent **period** (a day or month window)?  Only then is it a short, retryable
throttle.  Each helper returns the canonical lowercase phrase it matched, so
signals carry their evidence.

How matching stays linear: every pattern is written in lowercase and starts
with a literal, so :mod:`re` can skip straight to candidate positions instead
of trying a ``\\b`` or a case-folded class at every character; the word
boundary before a match is checked here (:func:`find`).  A pattern that began
with ``\\b`` and was tried at every one of 200 000 characters cost 20 ms; the
literal-first form costs well under 1 ms on the same text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from rateloop.classify._time import parse_duration
from rateloop.signal import Dimension

__all__ = [
    "dimension_of",
    "find",
    "find_all",
    "never_fits",
    "period_of",
    "spend_of",
    "wait_in",
    "wait_matches",
    "without_google_sentence",
]


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


#: At most this many matches of one pattern are looked at: a refusal names
#: its limit a few times, and only hostile text repeats a phrase thousands of
#: times (each look costs Python time, the regex scan itself does not).
MAX_CANDIDATES = 64


def find_all(
    pattern: re.Pattern[str], low: str, *, also: str = "", limit: int = MAX_CANDIDATES
) -> Iterator[re.Match[str]]:
    """Matches of ``pattern`` in lowercase ``low`` that start at a word boundary.

    A match whose first character is a word character must not follow one
    (the ``\\b`` the pattern leaves out); ``also`` names more characters that
    must not precede it (``"."`` keeps ``foo.429`` from reading as a 429).
    Only the first ``limit`` matches are looked at.
    """
    for looked, match in enumerate(pattern.finditer(low)):
        if looked >= limit:
            return
        start = match.start()
        if start == 0 or not _word(low[start]):
            yield match
            continue
        before = low[start - 1]
        if not _word(before) and before not in also:
            yield match


def find(pattern: re.Pattern[str], low: str, *, also: str = "") -> re.Match[str] | None:
    """The first of :func:`find_all`, or ``None``."""
    return next(find_all(pattern, low, also=also), None)


_SPEND: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), canonical)
    for pattern, canonical in (
        (r"insufficient[_ ]quota\b", "insufficient_quota"),
        (r"exceeded your current quota\b", "exceeded your current quota"),
        (r"credit balance (?:is )?too low\b", "credit balance is too low"),
        (r"insufficient[_ ]balance\b", "insufficient balance"),
        (r"insufficient[_ ](?:credits?|funds)\b", "insufficient credits"),
        (r"credit[_ ]limit\b", "credit limit"),
        (r"(?:out of|no remaining|purchase (?:more )?) ?credits?\b", "credits"),
        (r"spend(?:ing)?[_ ](?:limit|cap)\b", "spending limit"),
        (r"billing[_ ](?:hard[_ ]limit|not[_ ]active|error|details)\b", "billing"),
        (r"payment[_ ]required\b", "payment required"),
        (r"add funds\b", "add funds"),
        (r"余额不足", "insufficient balance"),
    )
)

# "exceeded your current quota" is spend at OpenAI (insufficient_quota), but
# Google writes the same sentence for every 429 quota error, per-minute ones
# included: alone, at Google, it does not say which limit was hit.
_GOOGLE_MARKS = ("googleapis.com", "ai.google.dev", "generativelanguage", "gemini")
_GOOGLE_SENTENCE = re.compile(
    r"exceeded your current quota[,.]? ?(?:please )?(?:check your plan and billing details)?"
)

# The third field says whether a match must start at a word boundary: quota
# ids run words together (``GenerateRequestsPerDayPerProjectPerModel``).
_PERIOD: tuple[tuple[re.Pattern[str], str, Dimension | None, bool], ...] = tuple(
    (re.compile(pattern), canonical, dimension, bounded)
    for pattern, canonical, dimension, bounded in (
        (r"requests per day\b|\(rpd\)|rpd\b", "requests per day", Dimension.REQUESTS_PER_DAY,
         True),
        (r"tokens per day\b|\(tpd\)|tpd\b", "tokens per day", Dimension.TOKENS_PER_DAY, True),
        (r"requests?perday|requests?_per_(?:\w+_)?day", "requests per day",
         Dimension.REQUESTS_PER_DAY, False),
        (r"tokens?(?:count)?perday|tokens?_per_(?:\w+_)?day", "tokens per day",
         Dimension.TOKENS_PER_DAY, False),
        (r"free-models-per-day", "free-models-per-day", Dimension.REQUESTS_PER_DAY, True),
        (r"per[ _-]?day\b|daily (?:limit|quota)\b", "per day", None, True),
        (r"perday\b", "per day", None, False),
        (r"per[ _-]?month\b|monthly (?:limit|quota)\b|/ ?month\b", "per month", None, True),
        (r"permonth\b", "per month", None, False),
        (r"weekly (?:limit|quota)\b|per[ _-]?week\b", "per week", None, True),
        # Ollama Cloud: "you have reached your session usage limit" / hourly / weekly.
        (r"(?:session|hourly|weekly|daily|monthly) usage limit\b", "usage limit", None, True),
    )
)

_DIMENSIONS: tuple[tuple[re.Pattern[str], Dimension], ...] = tuple(
    (re.compile(pattern), dimension)
    for pattern, dimension in (
        (r"input[ _-]tokens?\b", Dimension.INPUT_TOKENS),
        (r"output[ _-]tokens?\b", Dimension.OUTPUT_TOKENS),
        (r"tokens per min(?:ute)?\b|\(tpm\)|tpm\b|token rate limit\b|too many tokens\b",
         Dimension.TOKENS),
        (r"requests per min(?:ute)?\b|\(rpm\)|rpm\b|call rate limit\b|too many requests\b",
         Dimension.REQUESTS),
        (r"concurren(?:t|cy)\b", Dimension.CONCURRENCY),
    )
)

_UNIT = (
    r"(?:milliseconds?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|hr|h|days?|d|weeks?|w)"
    r"(?![a-zµ])"
)
_AMOUNT = rf"(?:\d+(?:\.\d+)?\s*{_UNIT}(?:\s*,?\s*(?:and\s+)?)?)+"
_WAIT = re.compile(
    rf"(?:try(?:ing)?\sagain|retry(?:ing)?|wait|resets?|available\sagain)"
    rf"(?:\s+(?:after|in|for))?\s+(?:about\s+|approximately\s+)?({_AMOUNT})"
)
_MAX_SCAN = 200_000

# "Limit 30000, Requested 45000" (OpenAI, Groq), "requested 45000 exceeds
# limit 30000": a single request larger than the whole limit never fits.
_LIMIT_REQUESTED = re.compile(
    r"limit:? ?(\d{1,15})[,;]? (?:used:? ?\d{1,15}[,;]? )?requested:? ?(\d{1,15})"
)
_REQUESTED_EXCEEDS = re.compile(
    r"requested:? ?(\d{1,15}) (?:tokens? )?(?:exceeds|is greater than|>) (?:the )?(?:\w+ )?"
    r"limit(?: of)?:? ?(\d{1,15})"
)
_TOO_LARGE = re.compile(
    r"request too large\b|request_too_large\b|request entity too large\b|"
    r"prompt is too long\b|exceeds the maximum allowed number of bytes|"
    r"maximum context length\b|context_length_exceeded\b|"
    r"exceeds (?:the )?(?:model(?:'s)? )?context window\b|"
    r"out of room in the model's context window"
)


# Words every pattern of a family contains: a family whose words are all
# absent is skipped with a few ``in`` tests (C-speed substring search).
_SPEND_WORDS = ("quota", "credit", "balance", "spend", "billing", "payment", "funds", "余额")
_PERIOD_WORDS = ("day", "month", "week", "rpd", "tpd", "usage limit")
_DIMENSION_WORDS = ("token", "request", "tpm", "rpm", "concurren", "call rate")
_WAIT_WORDS = ("again", "retry", "wait", "reset")
_FIT_WORDS = ("limit", "request", "too large", "too long", "context", "maximum", "bytes")


def _lowered(text: str) -> str:
    return text[:_MAX_SCAN].lower()


def _mentions(low: str, words: tuple[str, ...]) -> bool:
    return any(word in low for word in words)


def without_google_sentence(text: str) -> str:
    """``text`` without Google's "exceeded your current quota, please check your plan
    and billing details", which Google sends for every quota 429 (per-minute too)."""
    return _GOOGLE_SENTENCE.sub(" ", text[:_MAX_SCAN].lower())


def spend_of(text: str) -> str | None:
    """The spend phrase in ``text`` (billing, credit, exhausted quota), or ``None``."""
    low = _lowered(text)
    if not _mentions(low, _SPEND_WORDS):
        return None
    if any(mark in low for mark in _GOOGLE_MARKS):
        low = _GOOGLE_SENTENCE.sub(" ", low)
    for pattern, canonical in _SPEND:
        if find(pattern, low) is not None:
            return canonical
    return None


def period_of(text: str) -> tuple[str, Dimension | None] | None:
    """The day/week/month window named in ``text`` and its dimension, or ``None``."""
    low = _lowered(text)
    if not _mentions(low, _PERIOD_WORDS):
        return None
    for pattern, canonical, dimension, bounded in _PERIOD:
        if (find(pattern, low) if bounded else pattern.search(low)) is not None:
            return canonical, dimension
    return None


def dimension_of(text: str) -> Dimension | None:
    """The per-minute limit dimension a message names (TPM, RPM, input tokens …)."""
    low = _lowered(text)
    if not _mentions(low, _DIMENSION_WORDS):
        return None
    for pattern, dimension in _DIMENSIONS:
        if find(pattern, low) is not None:
            return dimension
    return None


def wait_matches(text: str) -> Iterator[float]:
    """Every wait stated in prose, in order, unclamped (seconds)."""
    low = _lowered(text)
    if not _mentions(low, _WAIT_WORDS):
        return
    for match in find_all(_WAIT, low):
        seconds = parse_duration(match.group(1).strip().rstrip(",").strip())
        if seconds is not None:
            yield seconds


def wait_in(text: str) -> float | None:
    """The first wait stated in prose: "try again in 1.5s", "retry after 6 seconds".

    Unclamped: a caller that keeps a reset time needs the real distance.
    """
    return next(wait_matches(text), None)


def never_fits(text: str) -> str | None:
    """Evidence that one request is larger than its whole limit, or ``None``.

    "Request too large", a 413-style phrase, or numbers that show it:
    "Limit 30000, Requested 45000" / "requested 45000 exceeds limit 30000".
    "Limit 30000, Used 29871, Requested 1200" fits once the window refills.
    """
    low = _lowered(text)
    if not _mentions(low, _FIT_WORDS):
        return None
    for match in find_all(_LIMIT_REQUESTED, low):
        if int(match.group(2)) > int(match.group(1)):
            return "requested exceeds limit"
    for match in find_all(_REQUESTED_EXCEEDS, low):
        if int(match.group(1)) > int(match.group(2)):
            return "requested exceeds limit"
    found = find(_TOO_LARGE, low)
    if found is not None:
        return found.group(0).replace("_", " ")
    return None
