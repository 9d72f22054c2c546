"""Generic HTTP evidence: Retry-After, rate-limit headers and JSON reset fields.

How it works:

* :func:`retry_after` reads the server's minimum wait from ``retry-after-ms``
  / ``x-ms-retry-after-ms`` (milliseconds) or ``retry-after`` (seconds, may be
  fractional, or an HTTP-date).  The largest stated minimum wins.
* :func:`observe` reads every limit the headers describe, on any response
  (including 200s): OpenAI-style ``x-ratelimit-{limit,remaining,reset}-
  {requests,tokens}``, Anthropic ``anthropic-ratelimit-*``, the IETF
  ``RateLimit`` / ``RateLimit-Policy`` structured fields and the older
  ``RateLimit-Limit/-Remaining/-Reset`` trio, single-window
  ``x-ratelimit-limit/-remaining/-reset`` (GitHub, OpenRouter, Together),
  Together's ``x-tokenlimit-*`` and Mistral's ``x-ratelimitbysize-*``.
  Each observation carries its window (``Observed.window``) where the
  header (IETF ``w=``) or the provider's documentation states it.
* :func:`body_reset` searches a JSON body, at any depth, for the reset fields
  listed in :data:`RESET_FIELDS`.

Nothing here raises on hostile input; unknown values are skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rateloop.classify._detect import detect
from rateloop.classify._evidence import MAX_JSON_NODES
from rateloop.classify._structured import parse_list
from rateloop.classify._time import parse_datetime, parse_number, reset_value, seconds_between
from rateloop.signal import Dimension, Observed, clamp_wait

__all__ = [
    "RESET_FIELDS",
    "Exhausted",
    "RetryAfter",
    "body_reset",
    "exhausted",
    "observe",
    "retry_after",
    "retry_after_raw",
]

#: JSON body fields searched (at any depth) for a wait or reset time, and
#: whether a bare small number there is milliseconds.
RESET_FIELDS: dict[str, bool] = {
    "retry_after": False,
    "retryAfter": False,
    "retry_after_ms": True,
    "retryAfterMs": True,
    "retry_after_seconds": False,
    "reset_at": False,
    "resetAt": False,
    "reset_time": False,
    "resets_at": False,
    "resets_in_seconds": False,
}


def retry_after(headers: Mapping[str, str], now: datetime) -> tuple[float | None, str | None]:
    """The server's minimum wait from the headers (clamped), and the header it came from."""
    found = retry_after_raw(headers, now)
    return clamp_wait(found.seconds), found.name


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """What the retry headers said: ``seconds`` unclamped (``None``: nothing
    readable), the header ``name``, the HTTP-date ``moment`` when one was sent,
    and the names of headers whose values could not be read."""

    seconds: float | None = None
    name: str | None = None
    moment: datetime | None = None
    malformed: tuple[str, ...] = ()


_LOG = logging.getLogger("rateloop")
_LOGGED_CHARS = 64


def _seconds_of(value: str, now: datetime) -> tuple[float | None, datetime | None]:
    """A Retry-After value: seconds (fractional too), an HTTP-date, or a repeated
    header joined by the client ("30, 30": the largest)."""
    number = parse_number(value)
    if number is not None:
        return number, None
    moment = parse_datetime(value)
    if moment is not None:
        return seconds_between(moment, now), moment
    parts = [parse_number(part) for part in value.split(",")[:16]]
    if len(parts) > 1 and all(part is not None for part in parts):
        return max(p for p in parts if p is not None), None
    return None, None


def retry_after_raw(headers: Mapping[str, str], now: datetime) -> RetryAfter:
    """The server's minimum wait, unclamped, from the retry headers.

    ``retry-after-ms`` / ``x-ms-retry-after-ms`` are precise and win over
    ``retry-after`` when both come (a server rounds ``retry-after`` up to whole
    seconds).  A value no parser reads is skipped, logged at DEBUG on the
    ``rateloop`` logger (cut to 64 characters) and named in ``malformed``.
    """
    malformed: list[str] = []
    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        value = headers.get(name)
        if value is None:
            continue
        number, _ = _seconds_of(value, now)
        if number is not None:
            return RetryAfter(seconds=number / 1000.0, name=name)
        malformed.append(name)
    value = headers.get("retry-after")
    result = RetryAfter()
    if value is not None:
        seconds, moment = _seconds_of(value, now)
        if seconds is not None:
            result = RetryAfter(seconds=seconds, name="retry-after", moment=moment)
        else:
            malformed.append("retry-after")
    if malformed:
        for name in malformed:
            _LOG.debug(
                "unreadable %s header ignored: %r", name, headers.get(name, "")[:_LOGGED_CHARS]
            )
        result = RetryAfter(
            seconds=result.seconds, name=result.name, moment=result.moment,
            malformed=tuple(malformed),
        )
    return result


# --- observed limits -------------------------------------------------------


def _num(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    return parse_number(value) if value is not None else None


def _reset(headers: Mapping[str, str], name: str, now: datetime) -> float | None:
    value = headers.get(name)
    return reset_value(value, now)[0] if value is not None else None


_MINUTE = 60.0
_HOUR = 3_600.0
_DAY = 86_400.0

#: (prefix, suffix, dimension, window); names are f"{prefix}{field}{suffix}".
#: ``window`` is the documented window in seconds, a ``{provider: seconds}``
#: table when it depends on the provider (``None`` key: every other provider),
#: or ``None`` when it is not known -- then nothing is guessed.
_FAMILIES: tuple[tuple[str, str, Dimension, float | dict[str | None, float] | None], ...] = (
    # OpenAI, Azure OpenAI, xAI, DeepSeek: RPM/TPM.  Groq: requests per DAY, tokens per minute.
    ("x-ratelimit-", "-requests", Dimension.REQUESTS, {"groq": _DAY, None: _MINUTE}),
    ("x-ratelimit-", "-tokens", Dimension.TOKENS, _MINUTE),
    ("anthropic-ratelimit-requests-", "", Dimension.REQUESTS, _MINUTE),
    ("anthropic-ratelimit-tokens-", "", Dimension.TOKENS, _MINUTE),
    ("anthropic-ratelimit-input-tokens-", "", Dimension.INPUT_TOKENS, _MINUTE),
    ("anthropic-ratelimit-output-tokens-", "", Dimension.OUTPUT_TOKENS, _MINUTE),
    # Together documents neither header's window (and its limits are dynamic).
    ("x-tokenlimit-", "", Dimension.TOKENS, None),
    ("x-ratelimitbysize-", "-minute", Dimension.TOKENS, _MINUTE),
    # Cerebras names the window in the header: requests per day, tokens per minute.
    ("x-ratelimit-", "-requests-day", Dimension.REQUESTS_PER_DAY, _DAY),
    ("x-ratelimit-", "-tokens-minute", Dimension.TOKENS, _MINUTE),
    # Single-window: GitHub's is per hour; OpenRouter's and Together's are not stated.
    ("x-ratelimit-", "", Dimension.REQUESTS, {"github": _HOUR}),
    # The older RateLimit-Limit draft carries its window only in a policy.
    ("ratelimit-", "", Dimension.REQUESTS, None),
)


def _families(
    headers: Mapping[str, str], now: datetime, provider: str | None
) -> Iterator[Observed]:
    for prefix, suffix, dimension, windows in _FAMILIES:
        limit = _num(headers, f"{prefix}limit{suffix}")
        remaining = _num(headers, f"{prefix}remaining{suffix}")
        reset = _reset(headers, f"{prefix}reset{suffix}", now)
        if limit is None and remaining is None and reset is None:
            continue
        window = (
            windows.get(provider, windows.get(None)) if isinstance(windows, dict) else windows
        )
        yield Observed(
            dimension=dimension,
            limit=limit,
            remaining=remaining,
            reset_after=reset,
            window=window,
        )


_UNITS = {
    "requests": Dimension.REQUESTS,
    "request": Dimension.REQUESTS,
    "concurrent-requests": Dimension.CONCURRENCY,
    "tokens": Dimension.TOKENS,
}


def _ietf(headers: Mapping[str, str]) -> Iterator[Observed]:
    """The current draft: ``RateLimit-Policy: "p";q=100;w=60`` + ``RateLimit: "p";r=50;t=30``."""
    policies = parse_list(headers.get("ratelimit-policy", ""))
    current = parse_list(headers.get("ratelimit", ""))
    for name in dict.fromkeys([*current, *policies]):
        state = current.get(name, {})
        policy = policies.get(name, {})
        limit = parse_number(policy.get("q", ""))
        remaining = parse_number(state.get("r", ""))
        reset = clamp_wait(parse_number(state.get("t", "")))
        if limit is None and remaining is None and reset is None:
            continue
        dimension = _UNITS.get(policy.get("qu", "requests").lower(), Dimension.REQUESTS)
        window = parse_number(policy.get("w", ""))
        yield Observed(
            dimension=dimension,
            limit=limit,
            remaining=remaining,
            reset_after=reset,
            window=window if window is not None and window > 0 else None,
        )


def observe(
    headers: Mapping[str, str], now: datetime, provider: str | None = None
) -> tuple[Observed, ...]:
    """Every limit the headers describe, one per dimension (first family wins).

    ``headers`` are normalized (lowercase names).  ``provider`` decides
    windows that differ by provider (Groq counts ``x-ratelimit-*-requests``
    per day); when it is not given, it is detected from the headers alone.
    """
    seen: dict[Dimension, Observed] = {}
    try:
        name = provider or detect(headers, None, "")
        for item in [*_families(headers, now, name), *_ietf(headers)]:
            seen.setdefault(item.dimension, item)
    except Exception:  # a parser bug must never break classification
        return tuple(seen.values())
    return tuple(seen.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class Exhausted:
    """An observed dimension with nothing remaining."""

    dimension: Dimension
    reset_after: float | None


def exhausted(observed: tuple[Observed, ...]) -> list[Exhausted]:
    return [
        Exhausted(dimension=o.dimension, reset_after=o.reset_after)
        for o in observed
        if o.remaining is not None and o.remaining <= 0
    ]


# --- JSON reset fields -----------------------------------------------------


def _walk(value: Any, budget: list[int], depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Every mapping entry, depth first: 16 levels, 256 items of a list, and at
    most ``budget[0]`` values in all (a hostile body may hold 100 000)."""
    if depth > 16 or budget[0] <= 0:
        return
    budget[0] -= 1
    if isinstance(value, Mapping):
        for key, item in value.items():
            if budget[0] <= 0:
                return
            yield str(key), item
            yield from _walk(item, budget, depth + 1)
    elif isinstance(value, list):
        for item in value[:256]:
            if budget[0] <= 0:
                return
            yield from _walk(item, budget, depth + 1)


def body_reset(data: Any, now: datetime) -> tuple[float | None, datetime | None, str | None]:
    """The first reset field found in a JSON body: ``(wait, reset_at, field)``."""
    try:
        for key, value in _walk(data, [MAX_JSON_NODES]):
            if key in RESET_FIELDS and not isinstance(value, Mapping | list):
                wait, moment = reset_value(value, now, millis=RESET_FIELDS[key])
                if wait is not None or moment is not None:
                    return wait, moment, key
    except Exception:
        return None, None, None
    return None, None, None
