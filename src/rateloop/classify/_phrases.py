"""Phrases that decide a refusal's kind, shared by the HTTP and CLI-text readers.

The order of questions is the rule that matters most: is it **spend**
(billing, credit, "exceeded your current quota")?  Else is it a spent
**period** (a day or month window)?  Only then is it a short, retryable
throttle.  Each helper returns the canonical lowercase phrase it matched, so
signals carry their evidence.
"""

from __future__ import annotations

import re

from rateloop.classify._time import parse_duration
from rateloop.signal import Dimension

__all__ = ["dimension_of", "period_of", "spend_of", "wait_in"]

_SPEND: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), canonical)
    for pattern, canonical in (
        (r"\binsufficient[_ ]quota\b", "insufficient_quota"),
        (r"\bexceeded your current quota\b", "exceeded your current quota"),
        (r"\bcredit balance is too low\b", "credit balance is too low"),
        (r"\binsufficient[_ ]balance\b", "insufficient balance"),
        (r"\binsufficient[_ ](?:credits?|funds)\b", "insufficient credits"),
        (r"\bcredit[_ ]limit\b", "credit limit"),
        (r"\b(?:out of|no remaining|purchase (?:more )?) ?credits?\b", "credits"),
        (r"\bspend(?:ing)?[_ ](?:limit|cap)\b", "spending limit"),
        (r"\bbilling[_ ](?:hard[_ ]limit|not[_ ]active|error|details)\b", "billing"),
        (r"\bpayment[_ ]required\b", "payment required"),
    )
)

_PERIOD: tuple[tuple[re.Pattern[str], str, Dimension | None], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), canonical, dimension)
    for pattern, canonical, dimension in (
        (r"\brequests per day\b|\(RPD\)", "requests per day", Dimension.REQUESTS_PER_DAY),
        (r"\btokens per day\b|\(TPD\)", "tokens per day", Dimension.TOKENS_PER_DAY),
        (r"Requests?PerDay|requests?_per_(?:\w+_)?day", "requests per day",
         Dimension.REQUESTS_PER_DAY),
        (r"Tokens?(?:Count)?PerDay|tokens?_per_(?:\w+_)?day", "tokens per day",
         Dimension.TOKENS_PER_DAY),
        (r"free-models-per-day", "free-models-per-day", Dimension.REQUESTS_PER_DAY),
        (r"\bper[ _-]?day\b|PerDay\b|\bdaily (?:limit|quota)\b", "per day", None),
        (r"\bper[ _-]?month\b|PerMonth\b|\bmonthly (?:limit|quota)\b|/ ?month\b",
         "per month", None),
        (r"\bweekly (?:limit|quota)\b|\bper[ _-]?week\b", "per week", None),
    )
)

_DIMENSIONS: tuple[tuple[re.Pattern[str], Dimension], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), dimension)
    for pattern, dimension in (
        (r"\binput[ _-]tokens?\b", Dimension.INPUT_TOKENS),
        (r"\boutput[ _-]tokens?\b", Dimension.OUTPUT_TOKENS),
        (r"\btokens per min(?:ute)?\b|\(TPM\)|\btoken rate limit\b|\btoo many tokens\b",
         Dimension.TOKENS),
        (r"\brequests per min(?:ute)?\b|\(RPM\)|\bcall rate limit\b|\btoo many requests\b",
         Dimension.REQUESTS),
        (r"\bconcurren(?:t|cy)\b", Dimension.CONCURRENCY),
    )
)

_UNIT = (
    r"(?:milliseconds?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d|weeks?|w)"
    r"(?![a-zµ])"
)
_AMOUNT = rf"(?:\d+(?:\.\d+)?\s*{_UNIT}(?:\s*,?\s*(?:and\s+)?)?)+"
_WAIT = re.compile(
    rf"\b(?:try(?:ing)? again|retry|wait|resets?|available again)"
    rf"(?:\s+(?:after|in|for))?\s+(?:about\s+|approximately\s+)?({_AMOUNT})",
    re.IGNORECASE,
)


def spend_of(text: str) -> str | None:
    """The spend phrase in ``text`` (billing, credit, exhausted quota), or ``None``."""
    for pattern, canonical in _SPEND:
        if pattern.search(text):
            return canonical
    return None


def period_of(text: str) -> tuple[str, Dimension | None] | None:
    """The day/week/month window named in ``text`` and its dimension, or ``None``."""
    for pattern, canonical, dimension in _PERIOD:
        if pattern.search(text):
            return canonical, dimension
    return None


def dimension_of(text: str) -> Dimension | None:
    """The per-minute limit dimension a message names (TPM, RPM, input tokens …)."""
    for pattern, dimension in _DIMENSIONS:
        if pattern.search(text):
            return dimension
    return None


def wait_in(text: str) -> float | None:
    """A wait stated in prose: "try again in 1.5s", "retry after 6 seconds"."""
    for match in _WAIT.finditer(text[:20_000]):
        seconds = parse_duration(match.group(1).strip().rstrip(",").strip())
        if seconds is not None:
            return seconds
    return None
