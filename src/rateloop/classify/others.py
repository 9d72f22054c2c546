"""GitHub, Slack, Mistral, Groq, OpenRouter, and single-window rate-limit headers.

* **GitHub** (and any API using the same headers): a 403 or 429 with
  ``x-ratelimit-remaining: 0`` is a temporary rate limit, not a permission
  problem; ``x-ratelimit-reset`` (epoch seconds) says when it lifts.  Secondary
  rate limits ("You have exceeded a secondary rate limit") come with
  ``retry-after``.
* **Slack** answers ``{"ok": false, "error": "ratelimited"}`` with a 429 and
  ``Retry-After``; other ``ok: false`` errors arrive with status 200.
* **Mistral**: a 429 with ``x-ratelimitbysize-remaining-month: 0`` is a spent
  month.
* **Groq**: status 498 is "Flex Tier Capacity Exceeded", an overload.
* **OpenRouter**: ``error.metadata.limit_source`` ``openrouter_credits`` /
  ``openrouter_key_limit`` is spend whatever the status (the key-cap 403
  "Key limit exceeded" is read by :mod:`rateloop.classify._standing`).  It
  copies the upstream limit headers into
  ``error.metadata.headers`` (``X-RateLimit-Reset`` in epoch milliseconds);
  :func:`nested_headers` lifts them out so the generic readers see them.
* Cohere, Together, xAI and DeepSeek need no rule of their own: their bodies
  are read by the shared throttle rule ("… / month" is a period, "Insufficient
  Balance", "credit limit" and "spending limit" are spend).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import islice

from rateloop.classify._evidence import MAX_HEADER_FIELDS, Evidence, Finding, error_object
from rateloop.classify._rules import message_of, throttle
from rateloop.classify._time import parse_number, reset_value
from rateloop.signal import Dimension, Kind

__all__ = [
    "github_rule",
    "groq_rule",
    "mistral_rule",
    "nested_headers",
    "openrouter_rule",
    "slack_rule",
]

_SECONDARY = re.compile(r"secondary rate limit|abuse detection", re.IGNORECASE)
_SLACK_THROTTLE = frozenset({"ratelimited", "rate_limited"})
_SLACK_PERMISSION = frozenset(
    {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
     "missing_scope", "no_permission", "access_denied"}
)


def github_rule(ev: Evidence) -> Finding | None:
    if ev.status not in (403, 429):
        return None
    remaining = parse_number(ev.header("x-ratelimit-remaining") or "")
    if remaining is not None and remaining <= 0:
        found = throttle(ev, message=message_of(ev), code=None, matched=None)
        if found.kind is not Kind.TEMPORARY:
            return found
        wait, reset_at = reset_value(ev.header("x-ratelimit-reset") or "", ev.now)
        return Finding(
            kind=Kind.TEMPORARY,
            code=ev.header("x-ratelimit-resource") or error_code(ev),
            matched="x-ratelimit-remaining: 0",
            dimension=Dimension.REQUESTS,
            retry_after=wait if found.retry_after is None else max(wait or 0.0, found.retry_after),
            reset_at=reset_at,
            request_id=ev.header("x-github-request-id"),
        )
    if _SECONDARY.search(message_of(ev)):
        return Finding(
            kind=Kind.TEMPORARY,
            matched="secondary rate limit",
            request_id=ev.header("x-github-request-id"),
        )
    return None


def slack_rule(ev: Evidence) -> Finding | None:
    data = ev.data
    if not (isinstance(data, Mapping) and data.get("ok") is False):
        return None
    error = data.get("error")
    if not isinstance(error, str):
        return None
    if error in _SLACK_THROTTLE or ev.status == 429:
        return Finding(kind=Kind.TEMPORARY, code=error, matched=error)
    if error in _SLACK_PERMISSION:
        return Finding(kind=Kind.PERMISSION, code=error, matched=error)
    if ev.status is not None and 200 <= ev.status < 300:
        return Finding(kind=Kind.INVALID, code=error, matched=error)
    return None


def mistral_rule(ev: Evidence) -> Finding | None:
    if ev.status != 429:
        return None
    remaining = parse_number(ev.header("x-ratelimitbysize-remaining-month") or "")
    if remaining is not None and remaining <= 0:
        return Finding(
            kind=Kind.PERIOD_QUOTA,
            code=error_code(ev),
            matched="x-ratelimitbysize-remaining-month: 0",
            dimension=Dimension.TOKENS,
        )
    return None


def groq_rule(ev: Evidence) -> Finding | None:
    if ev.status == 498:
        return Finding(kind=Kind.OVERLOAD, code=error_code(ev), matched="498")
    return None


#: OpenRouter's ``error.metadata.limit_source`` on a 402: the account's balance or
#: the key's own credit cap ran out (openrouter.ai/docs/api-reference/limits).
_OPENROUTER_SPEND = frozenset({"openrouter_credits", "openrouter_key_limit"})


def openrouter_rule(ev: Evidence) -> Finding | None:
    """A refusal whose metadata names the credit limit that ran out: spend, whatever
    the status a relay gives it."""
    err = error_object(ev.data)
    metadata = err.get("metadata") if err is not None else None
    if not isinstance(metadata, Mapping):
        return None
    source = metadata.get("limit_source")
    if isinstance(source, str) and source in _OPENROUTER_SPEND:
        return Finding(kind=Kind.SPEND, code=error_code(ev), matched=source)
    return None


def error_code(ev: Evidence) -> str | None:
    err = error_object(ev.data)
    value = err.get("code") if err is not None else None
    return str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None


def nested_headers(ev: Evidence) -> dict[str, str]:
    """Headers a gateway (OpenRouter) embedded in ``error.metadata.headers``."""
    err = error_object(ev.data)
    if err is None:
        return {}
    metadata = err.get("metadata")
    if not isinstance(metadata, Mapping):
        return {}
    headers = metadata.get("headers")
    if not isinstance(headers, Mapping):
        return {}
    return {
        str(k).lower(): str(v)
        for k, v in islice(headers.items(), MAX_HEADER_FIELDS)
        if isinstance(v, str | int | float) and not isinstance(v, bool)
    }
