"""The tool APIs agents call: GitHub, Slack, Discord, Notion, Atlassian, Brave Search.

A tool's limit is not a model's limit.  Every signal read from a tool API
carries a **tool scope** (``LimitSignal.scope``), the scope the tool itself
limits, so that the loop pauses that scope and never the model route the call
was made on (:func:`rateloop.loop.effects.observed_scope`):

============ ============================== ========================================
tool         scope                          why
============ ============================== ========================================
github       ``tool:github:<resource>``     each ``x-ratelimit-resource`` (core,
             (``tool:github`` for a         search, graphql, code_search ...) is its
             secondary limit)               own bucket of the token; a secondary
                                            limit holds every resource
slack        ``tool:slack[:<method>]``      tiers are per Web API method (the
                                            method is known from the request URL)
discord      ``tool:discord[:<bucket>]``    per-route buckets (``X-RateLimit-Bucket``);
                                            a global limit holds the whole bot
notion       ``tool:notion``                per integration (connection)
atlassian    ``tool:atlassian[:<reason>]``  the points quota holds the whole tenant;
                                            burst and per-issue limits
                                            (``RateLimit-Reason``) hold less
brave        ``tool:brave``                 per subscription key (second and month)
============ ============================== ========================================

The token or installation is not in the scope: a response does not say which
it was.  A process that calls a tool with several tokens names its routes
itself (``Route("tool", "github", project="<installation>")``).

What each reader adds to the shared rules:

* **GitHub**: a GraphQL point limit arrives as a **200** whose ``errors``
  carry ``"type": "RATE_LIMITED"`` (or ``"RATE_LIMIT"``); it is a throttle
  until ``x-ratelimit-reset``.  (403/429 with ``x-ratelimit-remaining: 0``
  and secondary limits are read by :func:`rateloop.classify.others.github_rule`.)
* **Discord**: ``retry_after`` is seconds (a float) since API v8; before, it
  and ``Retry-After`` were milliseconds.  An integer ``retry_after`` equal to
  ``Retry-After`` with no ``X-RateLimit-Reset-After`` is that older form and
  is read as milliseconds.  ``global: true`` / ``X-RateLimit-Global`` /
  ``X-RateLimit-Scope: global`` hold the whole bot.
* **Notion**: ``{"object": "error", "code": "rate_limited"}`` with
  ``Retry-After``.
* **Atlassian** (Jira, Confluence): 429 with ``Retry-After``,
  ``X-RateLimit-Reset`` as ISO 8601 and ``RateLimit-Reason``; a spent hourly
  points quota waits until its reset.
* **Brave Search**: ``X-RateLimit-{Limit,Remaining,Reset,Policy}`` list a
  per-second and a per-month window (``"1, 15000"``); a 429 with the month
  spent (or ``quota_current >= quota_limit`` in the body) is
  ``period_quota`` until the month resets, else a one-second throttle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from rateloop.classify._evidence import Evidence, Finding, error_object
from rateloop.classify._rules import message_of, throttle
from rateloop.classify._time import parse_number, reset_value
from rateloop.signal import Dimension, Kind, LimitSignal

__all__ = [
    "TOOLS",
    "atlassian_rule",
    "brave_rule",
    "carries_error",
    "discord_rule",
    "github_graphql_rule",
    "notion_rule",
    "operation_of",
    "prepared",
    "tool_scope",
    "with_request",
]

#: The tool APIs Read recognises (provider names whose signals carry a tool scope).
TOOLS = ("atlassian", "brave", "discord", "github", "notion", "slack")

_GRAPHQL_LIMITED = frozenset({"RATE_LIMITED", "RATE_LIMIT"})
# A scope part is a name a header or URL gave: kept to a safe, short alphabet.
_PART = re.compile(r"[^A-Za-z0-9_.-]+")
_MAX_PART = 64
_MONTHISH = 86_400.0  # a window this long or longer is a period, not a throttle


def _part(value: str | None) -> str | None:
    if not value:
        return None
    cleaned = _PART.sub("_", value.strip())[:_MAX_PART].strip("_")
    return cleaned or None


# --- GitHub GraphQL --------------------------------------------------------


def _graphql_limit(data: Any) -> str | None:
    """The rate-limit ``type`` of a GraphQL ``errors`` list, if it has one."""
    if not isinstance(data, Mapping):
        return None
    errors = data.get("errors")
    if not isinstance(errors, list):
        return None
    for item in errors[:32]:
        if isinstance(item, Mapping) and item.get("type") in _GRAPHQL_LIMITED:
            return str(item["type"])
    return None


def carries_error(ev: Evidence) -> bool:
    """Whether a 2xx tool response is a refusal (GitHub's GraphQL rate limit)."""
    return ev.provider == "github" and _graphql_limit(ev.data) is not None


def github_graphql_rule(ev: Evidence) -> Finding | None:
    kind = _graphql_limit(ev.data) if ev.provider == "github" else None
    if kind is None:
        return None
    wait, reset_at = reset_value(ev.header("x-ratelimit-reset") or "", ev.now)
    errors = ev.data.get("errors") if isinstance(ev.data, Mapping) else None
    first = errors[0] if isinstance(errors, list) and errors else None
    code = first.get("code") if isinstance(first, Mapping) else None
    return Finding(
        kind=Kind.TEMPORARY,
        code=str(code) if isinstance(code, str) else kind,
        matched=kind,
        dimension=Dimension.REQUESTS,
        retry_after=wait,
        reset_at=reset_at,
        request_id=ev.header("x-github-request-id"),
    )


# --- Discord ---------------------------------------------------------------


def _discord_global(ev: Evidence) -> bool:
    data = ev.data
    if isinstance(data, Mapping) and data.get("global") is True:
        return True
    if (ev.header("x-ratelimit-global") or "").strip().lower() == "true":
        return True
    return (ev.header("x-ratelimit-scope") or "").strip().lower() == "global"


def _discord_millis(ev: Evidence) -> float | None:
    """The older API's ``retry_after`` in milliseconds, when this response uses it."""
    data = ev.data
    if ev.header("x-ratelimit-reset-after") is not None or not isinstance(data, Mapping):
        return None
    value = data.get("retry_after")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    header = parse_number(ev.header("retry-after") or "")
    return float(value) if header is not None and header == value else None


def prepared(ev: Evidence) -> Evidence:
    """Evidence a tool's generic readers would misread, put right before reading.

    Discord's older ``Retry-After`` and ``retry_after`` were milliseconds:
    they are read as the ``retry-after-ms`` header and ``retry_after_ms``
    field they really are (that header outranks ``retry-after``).
    """
    if ev.provider != "discord" or ev.status != 429:
        return ev
    millis = _discord_millis(ev)
    if millis is None:
        return ev
    headers = {k: v for k, v in ev.headers.items() if k != "retry-after"}
    headers["retry-after-ms"] = f"{millis:g}"
    data = {k: v for k, v in ev.data.items() if k != "retry_after"}
    data["retry_after_ms"] = millis
    return replace(ev, headers=headers, data=data)


def discord_rule(ev: Evidence) -> Finding | None:
    if ev.provider != "discord" or ev.status != 429:
        return None
    data = ev.data if isinstance(ev.data, Mapping) else {}
    wait = parse_number(ev.header("x-ratelimit-reset-after") or "")
    body = data.get("retry_after")
    # Milliseconds (the older API) were moved to ``retry-after-ms`` by prepared().
    millis = ev.header("retry-after-ms") is not None or _discord_millis(ev) is not None
    if wait is None and not millis and not isinstance(body, bool):
        wait = parse_number(body) if isinstance(body, int | float | str) else None
    code = data.get("code")
    return Finding(
        kind=Kind.TEMPORARY,
        code=str(code) if isinstance(code, int | str) and not isinstance(code, bool) else None,
        matched="global rate limit" if _discord_global(ev) else "429",
        dimension=Dimension.REQUESTS,
        retry_after=wait,
    )


# --- Notion ----------------------------------------------------------------


def notion_rule(ev: Evidence) -> Finding | None:
    if ev.provider != "notion":
        return None
    err = error_object(ev.data)
    if err is None or err.get("code") != "rate_limited":
        return None
    return Finding(kind=Kind.TEMPORARY, code="rate_limited", matched="rate_limited",
                   dimension=Dimension.REQUESTS)


# --- Atlassian -------------------------------------------------------------


def _atlassian_reason(ev: Evidence) -> str | None:
    return ev.header("ratelimit-reason") or ev.header("x-beta-ratelimit-reason")


def atlassian_rule(ev: Evidence) -> Finding | None:
    if ev.provider != "atlassian" or ev.status != 429:
        return None
    found = throttle(ev, message=message_of(ev), code=None, matched=None)
    if found.kind is not Kind.TEMPORARY:
        return found
    reason = _atlassian_reason(ev)
    wait, reset_at = reset_value(
        ev.header("x-ratelimit-reset") or ev.header("x-beta-ratelimit-reset") or "", ev.now
    )
    return Finding(
        kind=Kind.TEMPORARY,
        code=reason,
        matched=f"RateLimit-Reason: {reason}" if reason else "429",
        dimension=Dimension.REQUESTS,
        retry_after=wait,
        reset_at=reset_at,
    )


# --- Brave Search ----------------------------------------------------------


def _numbers(value: str | None) -> list[float | None]:
    return [parse_number(part) for part in (value or "").split(",")[:8]] if value else []


def _windows(ev: Evidence) -> list[float | None]:
    """The window of each listed limit, from ``X-RateLimit-Policy: 1;w=1, 15000;w=2592000``."""
    out: list[float | None] = []
    for part in (ev.header("x-ratelimit-policy") or "").split(",")[:8]:
        match = re.search(r"\bw=(\d+(?:\.\d+)?)", part)
        out.append(float(match.group(1)) if match else None)
    return out


def _brave_quota_spent(ev: Evidence) -> bool:
    err = error_object(ev.data)
    meta = err.get("meta") if err is not None else None
    if not isinstance(meta, Mapping):
        return False
    used, limit = parse_number(meta.get("quota_current")), parse_number(meta.get("quota_limit"))
    return used is not None and limit is not None and limit > 0 and used >= limit


def brave_rule(ev: Evidence) -> Finding | None:
    if ev.provider != "brave" or ev.status != 429:
        return None
    remaining = _numbers(ev.header("x-ratelimit-remaining"))
    resets = _numbers(ev.header("x-ratelimit-reset"))
    windows = _windows(ev)
    err = error_object(ev.data)
    code = err.get("code") if err is not None else None
    code = code if isinstance(code, str) else None
    spent_long: float | None = None
    short_wait: float | None = None
    for index, left in enumerate(remaining):
        if left is None or left > 0:
            continue
        reset = resets[index] if index < len(resets) else None
        window = windows[index] if index < len(windows) else None
        # Without a policy, Brave's second value is the month (its documented order).
        long = window >= _MONTHISH if window is not None else index > 0
        if long:
            spent_long = reset if reset is not None else spent_long
        elif reset is not None:
            short_wait = reset if short_wait is None else max(short_wait, reset)
    if spent_long is not None or _brave_quota_spent(ev):
        return Finding(
            kind=Kind.PERIOD_QUOTA, code=code, matched="monthly quota spent",
            dimension=Dimension.REQUESTS, retry_after=spent_long,
        )
    return Finding(
        kind=Kind.TEMPORARY, code=code, matched=code or "429",
        dimension=Dimension.REQUESTS, retry_after=short_wait,
    )


# --- scope and operation ---------------------------------------------------


def tool_scope(ev: Evidence, finding: Finding) -> str | None:
    """The scope the tool limits (see the table above), or ``None`` for a model provider."""
    tool = ev.provider
    if tool not in TOOLS:
        return None
    part: str | None = None
    if tool == "github":
        if _graphql_limit(ev.data) is not None:
            part = "graphql"
        elif finding.matched != "secondary rate limit":
            part = _part(ev.header("x-ratelimit-resource"))
    elif tool == "discord":
        part = None if _discord_global(ev) else _part(ev.header("x-ratelimit-bucket"))
    elif tool == "atlassian":
        reason = _atlassian_reason(ev) or ""
        # The points quota holds the tenant (the whole tool); burst and
        # per-issue limits hold one endpoint or issue.
        part = None if "quota" in reason else _part(reason)
    return f"tool:{tool}:{part}" if part else f"tool:{tool}"


def operation_of(
    method: str | None, url: str | None, tool: str | None
) -> tuple[str | None, str | None]:
    """``(operation, scope part)`` from the request a tool response answered.

    The operation is ``"METHOD /path"`` (no query: it may carry tokens);
    Slack's scope part is the Web API method (``chat.postMessage``), the unit
    its tiers limit.
    """
    if not isinstance(url, str) or not url:
        return None, None
    try:
        path = urlsplit(url).path or "/"
    except ValueError:
        return None, None
    verb = method.upper() if isinstance(method, str) and method else None
    operation = f"{verb} {path}" if verb else path
    part = None
    if tool == "slack" and "/api/" in path:
        part = _part(path.rsplit("/api/", 1)[1].strip("/"))
    return operation[:256], part


def with_request(signal: LimitSignal, method: object, url: object) -> LimitSignal:
    """A tool's signal completed from the request it answered: ``operation``, and
    Slack's method in the scope.  Any other signal is returned as it is."""
    if not (signal.scope or "").startswith("tool:") or signal.operation is not None:
        return signal
    operation, part = operation_of(
        method if isinstance(method, str) else None,
        url if isinstance(url, str) else str(url) if url is not None else None,
        signal.provider,
    )
    if operation is None:
        return signal
    scope = f"{signal.scope}:{part}" if part and signal.scope == "tool:slack" else signal.scope
    return replace(signal, operation=operation, scope=scope)
