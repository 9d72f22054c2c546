"""Provider traps: bodies whose status or type says one thing and whose content another.

How it works: after a provider rule (or the status fallback) has a finding,
:func:`reconcile` checks it against the strongest evidence, in this order:

0. A refusal that **stands** (:mod:`rateloop.classify._standing`), whatever
   the status a relay gave it, 2xx error bodies included: a request that
   must change (Bedrock's "on-demand throughput isn't supported", max tokens
   over the model's limit, a content filter) is ``invalid``; a quota whose
   limit is zero ("limit: 0") is ``permission``; an OpenRouter key cap or
   affordability refusal is ``spend`` (it is sent as a 403).
1. A request that can **never fit** its limit ("Limit 30000, Requested
   45000", "Request too large", Groq's 413) is ``invalid`` — decided inside
   :func:`~rateloop.classify._rules.throttle`, before anything else.
2. A gateway's **5xx carrying the upstream's error object with code 402** is
   ``spend``; so is a **spend phrase** in the message ("insufficient
   balance (1008)", "余额不足"), whatever the status or type: MiniMax sends
   it as a 500 ``api_error``.
3. A **429 whose message reads as a rate limit** is a throttle whatever its
   ``type``: Anthropic's OpenAI-compatible endpoint sends a rate limit as
   ``invalid_request_error``; Together sends "60 queries per minute" with
   type ``credit_limit``.
4. Then the provider's code or type, then the status.

:func:`envelope` reads the failures that arrive with status 200: MiniMax's
``base_resp.status_code``, Zhipu-style ``{"error": {"code": "1302"}}``
objects, and any other error object in a 2xx body or stream (OpenRouter's
mid-stream ``{"error": {"code": 429}}``), by its numeric code, else by its
phrases.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from rateloop.classify._evidence import Evidence, Finding, error_object
from rateloop.classify._phrases import find, spend_of
from rateloop.classify._rules import code_of, message_of, overloaded, throttle
from rateloop.classify._standing import STANDING, credit_exhausted, must_change, zero_quota
from rateloop.classify._time import parse_datetime, parse_number
from rateloop.signal import Kind

__all__ = ["envelope", "reconcile"]

_RATE_WORDS = re.compile(
    r"rate[ _-]?limit|too many requests|(?:queries|requests|tokens) per (?:second|minute)|"
    r"\(rpm\)|\(tpm\)|try again in|retry after"
)

# MiniMax base_resp.status_code (platform.minimaxi.com, error codes).
_MINIMAX: dict[int, Kind] = {
    1000: Kind.SERVER_ERROR,  # unknown error
    1001: Kind.SERVER_ERROR,  # request timed out
    1002: Kind.TEMPORARY,  # rate limit (RPM)
    1004: Kind.PERMISSION,  # authentication failed
    1008: Kind.SPEND,  # insufficient balance
    1013: Kind.SERVER_ERROR,  # internal service error
    1026: Kind.INVALID,  # input flagged by the content filter
    1027: Kind.INVALID,  # output flagged by the content filter
    1039: Kind.TEMPORARY,  # token rate limit (TPM)
    2013: Kind.INVALID,  # invalid parameters
}
# Zhipu / Z.ai error codes (docs.bigmodel.cn, API error codes).
_ZHIPU: dict[str, Kind] = {
    "1000": Kind.PERMISSION, "1001": Kind.PERMISSION, "1002": Kind.PERMISSION,
    "1003": Kind.PERMISSION, "1004": Kind.PERMISSION,
    "1113": Kind.SPEND,  # insufficient balance or no resource package
    "1261": Kind.INVALID,  # prompt too long
    "1301": Kind.INVALID,  # content filter
    "1302": Kind.TEMPORARY,  # concurrency / rate too high
    "1303": Kind.TEMPORARY,  # request frequency too high
    "1305": Kind.OVERLOAD,  # the model is receiving too many requests
    "1308": Kind.PERIOD_QUOTA,  # a usage limit of the plan is reached (with its reset time)
    "1310": Kind.PERIOD_QUOTA,  # weekly / monthly limit of the plan
    "1316": Kind.PERIOD_QUOTA,  # the plan's 5-hour limit (newer code)
}
# "您的限额将在 2026-08-25 07:41:44 重置" (Beijing time), "reset at 2026-08-14T00:00:00Z".
_RESET_STAMP = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ t](\d{2}:\d{2}(?::\d{2})?)(z|[+-]\d{2}:?\d{2})?"
)


def _zhipu_reset(message: str) -> datetime | None:
    found = _RESET_STAMP.search(message[:2_000].lower())
    if found is None:
        return None
    day, clock, zone = found.groups()
    stamp = parse_datetime(f"{day}T{clock}{'+00:00' if zone == 'z' else zone or '+08:00'}")
    return stamp.astimezone(UTC) if stamp is not None else None


def _reads_as_throttle(message: str) -> bool:
    return find(_RATE_WORDS, message[:20_000].lower()) is not None


#: Kinds a standing refusal overrules: the ones that would be retried or waited out.
_WAITABLE = frozenset(
    {Kind.TEMPORARY, Kind.PERIOD_QUOTA, Kind.SERVER_ERROR, Kind.OVERLOAD, Kind.UNKNOWN}
)


def _standing(message: str, finding: Finding) -> Finding | None:
    """A refusal no wait changes, read from the message whatever the status or type
    (:mod:`rateloop.classify._standing`): must change → ``invalid``, a zero limit →
    ``permission``, a key cap or missing credits → ``spend``.  A finding already
    of that kind is kept as it is (its provider's evidence is the better name),
    and the later corrections never turn it back into a throttle."""
    rules = (
        (Kind.INVALID, must_change, _WAITABLE),
        (Kind.PERMISSION, zero_quota, _WAITABLE | {Kind.INVALID}),
        (Kind.SPEND, credit_exhausted, _WAITABLE | {Kind.INVALID, Kind.PERMISSION}),
    )
    for kind, reader, overrules in rules:
        if finding.kind is not kind and finding.kind not in overrules:
            continue
        matched = reader(message)
        if matched is None:
            continue
        if finding.kind is kind and not (finding.matched or "0").isdigit():
            return finding  # the provider's own name for it (a code, a header) is kept
        return Finding(kind=kind, code=finding.code, matched=matched,
                       request_id=finding.request_id)
    return None


def reconcile(ev: Evidence, finding: Finding) -> Finding:
    """The finding, corrected where stronger evidence contradicts it (see the module)."""
    if ev.status is None or finding.kind is Kind.OK:
        return finding
    message = message_of(ev)
    standing = _standing(message, finding)
    if standing is not None:
        return standing
    if ev.status < 400:
        return finding
    if ev.status >= 500 and finding.kind in (Kind.SERVER_ERROR, Kind.UNKNOWN):
        relayed = _relayed_code(ev)
        if relayed == 402:
            # A gateway relays the upstream's error object with its own 5xx: the
            # object's code says the account ran out of credit.
            return Finding(kind=Kind.SPEND, code=finding.code,
                           matched=f"error 402 in a {ev.status}", request_id=finding.request_id)
    if finding.kind in (Kind.SERVER_ERROR, Kind.UNKNOWN, Kind.INVALID, Kind.OVERLOAD):
        spend = spend_of(message)
        if spend is not None:
            return Finding(kind=Kind.SPEND, code=finding.code, matched=spend,
                           request_id=finding.request_id)
    if (
        ev.status == 429
        and finding.kind in (Kind.INVALID, Kind.SPEND, Kind.PERMISSION)
        and finding.matched not in STANDING
        and spend_of(message) is None
        and _reads_as_throttle(message)
    ):
        found = throttle(ev, message=message, code=finding.code, matched=finding.matched)
        if found.kind is not Kind.INVALID:  # a request that never fits stays invalid
            return Finding(
                kind=found.kind, code=finding.code,
                matched=f"429 rate limit despite {finding.code or finding.matched}",
                dimension=found.dimension, retry_after=found.retry_after,
                soft_period=found.soft_period, request_id=finding.request_id,
            )
    if (
        ev.status == 429
        and finding.kind is Kind.TEMPORARY
        and overloaded(message)
        and not _reads_as_throttle(message)
    ):
        # Moonshot: 429 "The engine is currently overloaded" (typed as a rate limit).
        return Finding(kind=Kind.OVERLOAD, code=finding.code, matched="overloaded",
                       request_id=finding.request_id)
    return finding


def _relayed_code(ev: Evidence) -> int | None:
    """The numeric ``code`` of the body's error object (``402``, ``"402"``), or ``None``."""
    err = error_object(ev.data)
    raw = err.get("code") if err is not None else None
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        return None
    number = parse_number(raw)
    return int(number) if number is not None and 100 <= number < 600 else None


def _by_code(ev: Evidence, code: int | None, message: str, label: str | None) -> Finding | None:
    if code is None:
        return None
    if code == 429:
        return throttle(ev, message=message, code=label, matched=f"error {code} in a {ev.status}")
    if code == 402:
        return Finding(kind=Kind.SPEND, code=label, matched=spend_of(message) or "402")
    if code in (401, 403):
        return Finding(kind=Kind.PERMISSION, code=label, matched=str(code))
    if code == 529 or (code == 503 and overloaded(message)):
        return Finding(kind=Kind.OVERLOAD, code=label, matched=str(code))
    if 500 <= code < 600:
        return Finding(kind=Kind.SERVER_ERROR, code=label, matched=str(code))
    if 400 <= code < 500:
        return Finding(kind=Kind.INVALID, code=label, matched=str(code))
    return None


def _minimax(ev: Evidence, data: Mapping[str, Any]) -> Finding | None:
    base = data.get("base_resp")
    if not isinstance(base, Mapping):
        return None
    code = base.get("status_code")
    if not isinstance(code, int) or isinstance(code, bool) or code == 0:
        return None
    message = str(base.get("status_msg", ""))[:2_000]
    label = str(code)
    kind = _MINIMAX.get(code)
    if kind is Kind.TEMPORARY:
        return throttle(ev, message=message, code=label, matched=f"base_resp {code}")
    if kind is not None:
        return Finding(kind=kind, code=label, matched=f"base_resp {code}")
    spend = spend_of(message)
    if spend is not None:
        return Finding(kind=Kind.SPEND, code=label, matched=spend)
    return Finding(kind=Kind.SERVER_ERROR, code=label, matched=f"base_resp {code}")


def _error_object(ev: Evidence, data: Any) -> Finding | None:
    err = error_object(data)
    if err is None or err is data or not err:
        return None
    message = message_of(ev)
    raw = err.get("code")
    label = code_of(ev)
    if isinstance(raw, str) and raw in _ZHIPU:
        kind = _ZHIPU[raw]
        if kind is Kind.PERIOD_QUOTA:
            return Finding(kind=kind, code=raw, matched=f"code {raw}",
                           reset_at=_zhipu_reset(message))
        if kind is Kind.TEMPORARY:
            return throttle(ev, message=message, code=raw, matched=f"code {raw}")
        return Finding(kind=kind, code=raw, matched=f"code {raw}")
    number = parse_number(raw) if isinstance(raw, int | str) and not isinstance(raw, bool) else None
    found = _by_code(ev, int(number) if number is not None and 100 <= number < 600 else None,
                     message, label)
    if found is not None:
        return found
    spend = spend_of(message)
    if spend is not None:
        return Finding(kind=Kind.SPEND, code=label, matched=spend)
    if _reads_as_throttle(message):
        return throttle(ev, message=message, code=label, matched="rate limit in a 2xx body")
    if overloaded(message):
        return Finding(kind=Kind.OVERLOAD, code=label, matched="overloaded")
    if not message or not isinstance(err.get("message"), str):
        return None
    return Finding(kind=Kind.SERVER_ERROR, code=label, matched=f"error in a {ev.status} body")


def envelope(ev: Evidence) -> Finding | None:
    """A failure carried by a 2xx body (or a 4xx/5xx Zhipu/MiniMax body), or ``None``."""
    data = ev.data[0] if isinstance(ev.data, list) and ev.data else ev.data
    if not isinstance(data, Mapping):
        return None
    found = _minimax(ev, data)
    if found is not None:
        return found
    if ev.status is not None and 200 <= ev.status < 300:
        err = error_object(data)
        if ev.sse_error and err is not None and isinstance(err.get("type"), str):
            return None  # a typed stream error (Anthropic's): the stream rule reads it
        return _error_object(ev, data)
    err = error_object(data)
    raw = err.get("code") if err is not None else None
    if isinstance(raw, str) and raw in _ZHIPU:
        return _error_object(ev, data)
    return None
