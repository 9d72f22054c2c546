"""Checks of single values the schema table cannot express: scope keys, limit bounds, URLs.

A ``[limits."scope"]`` key must be a scope some route can have; every
numeric limit field has an upper bound and the profile is a name
(``LimitSpec`` checks the lower bounds and the other kinds); a backend URL
needs a scheme (in any case: RFC 3986) and a port that parses.
:func:`shown` keeps a huge number out of an error message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from rateloop._url import url_scheme
from rateloop.admission.profile import PROFILES
from rateloop.timing.ladder import NO_BATCH_CLASSES, RUNGS

__all__ = [
    "LIMIT_ALIASES",
    "LIMIT_BOUNDS",
    "limit_bound_problems",
    "limit_kind_problems",
    "rungs_problem",
    "scope_key_problem",
    "shown",
    "url_problem",
]

#: The upper bound of each numeric [limits."scope"] field (LimitSpec checks the rest).
LIMIT_BOUNDS: Mapping[str, tuple[float, str]] = {
    **dict.fromkeys(
        (
            "requests_per_minute",
            "input_tokens_per_minute",
            "output_tokens_per_minute",
            "tokens_per_minute",
            "requests_per_day",
        ),
        (10**12, "an integer from 1 to 1000000000000, or leave it unset for no limit"),
    ),
    "concurrency": (1_000_000, "an integer from 1 to 1000000, or leave it unset for no limit"),
    "lease_ttl_secs": (86_400, "a number of seconds from 1 to 86400"),
    "burst": (1, "a fraction 0 < burst <= 1"),
    "reserve": (0.5, "a fraction 0 <= reserve < 0.5"),
}
#: The short names of limit fields that providers' consoles print, written by habit.
LIMIT_ALIASES: Mapping[str, str] = {
    "rpm": "requests_per_minute",
    "rpd": "requests_per_day",
    "tpm": "tokens_per_minute",
    "itpm": "input_tokens_per_minute",
    "otpm": "output_tokens_per_minute",
}
_SCOPE_SEGMENT = re.compile(r"^[^\s:]+$")
_PROVIDER = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")


def shown(value: Any) -> str:
    """``repr(value)``, but a number too long to read is described, not printed."""
    if isinstance(value, int) and not isinstance(value, bool):
        digits = len(str(abs(value))) if abs(value) < 10**4000 else 4000
        if digits > 24:
            sign, more = ("-" if value < 0 else ""), ("+" if digits == 4000 else "")
            return f"{sign}<an integer of {digits}{more} digits>"
    return repr(value)


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable backend URL (scheme, port), or None."""
    scheme = url_scheme(url)
    if not scheme or not url[len(scheme) + 1 :].startswith("//"):
        return "it has no scheme such as 'redis://'"
    try:
        port = urlsplit(url).port
    except ValueError:
        return "its port is not a number from 1 to 65535"
    if port == 0:
        return "its port is not a number from 1 to 65535"
    return None


def scope_key_problem(key: object) -> str | None:
    """Why ``key`` cannot be a route's scope (``provider:model[:project[:tenant]]``), or None."""
    if not isinstance(key, str) or not key:
        return "a scope key is a non-empty string"
    parts = key.split(":")
    if not 2 <= len(parts) <= 4 or not all(_SCOPE_SEGMENT.match(p) for p in parts):
        return (
            f"{key!r} is not a scope: write provider:model[:project[:tenant]], "
            "e.g. 'openai:gpt-4o'; a route never matches a bare model name"
        )
    if not _PROVIDER.match(parts[0]):
        return (
            f"the provider {parts[0]!r} of {key!r} is not a lowercase name; "
            f"routes name providers in lowercase, e.g. {parts[0].lower() + ':' + parts[1]!r}"
        )
    return None


def limit_bound_problems(spec: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(field, value, allowed) for each numeric limit field past its upper bound."""
    out: list[tuple[str, Any, str]] = []
    for name, (hi, allowed) in LIMIT_BOUNDS.items():
        value = spec.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        try:
            too_big = float(value) > hi or math.isnan(float(value))
        except OverflowError:
            too_big = True
        if too_big:
            out.append((name, value, allowed))
    return out


def limit_kind_problems(spec: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(field, value, allowed) for a ``profile`` that is not a name.

    ``LimitSpec`` looks the profile up in a dict, so a list or a table there
    would raise ``TypeError`` instead of a ConfigError; the policy names it first.
    """
    profile = spec.get("profile")
    if profile is None or isinstance(profile, str):
        return []
    return [("profile", profile, ", ".join(repr(p) for p in PROFILES))]


def rungs_problem(rungs: tuple[str, ...], allowed: tuple[str, ...]) -> str | None:
    """Why ``rungs`` is not a ladder made of ``allowed`` rungs (see docs/ladder.md), or None."""
    for rung in rungs:
        if rung not in RUNGS:
            return f"unknown rung {rung!r} (the rungs: {', '.join(RUNGS)})"
        if rung not in allowed:
            classes = " and ".join(sorted(NO_BATCH_CLASSES))
            return f"rung {rung!r} is not allowed here: {classes} work never goes to batch"
    if len(set(rungs)) < len(rungs):
        twice = next(r for r in rungs if rungs.count(r) > 1)
        return f"rung {twice!r} is listed twice"
    if "park" in rungs[:-1]:
        return "rung 'park' must be the last: nothing follows parking"
    if not rungs:
        return "a ladder needs at least one rung; leave it unset for the route and its fallbacks"
    return None
