"""OpenAI, Azure OpenAI and the OpenAI-compatible error bodies (Groq, Together, DeepSeek …).

Errors look like ``{"error": {"message", "type", "param", "code"}}``.  The code
decides first: ``insufficient_quota`` is spend however it is phrased;
``rate_limit_exceeded`` (and Groq's ``type: tokens|requests``) is a throttle
whose window and dimension come from the message ("tokens per min (TPM)",
"requests per day (RPD)") and whose minimum wait is "Please try again in 20ms"
(OpenAI) or "Please retry after 6 seconds" (Azure).  A 503 "The engine is
currently overloaded" is overload.

Flex processing (``service_tier="flex"``) has capacity of its own, and when
it is short OpenAI answers "a ``429 Resource Unavailable`` error code", which
is not charged and which the guide says to meet by retrying with exponential
backoff or by sending the request again at the standard tier
(developers.openai.com/api/docs/guides/flex-processing, "Resource unavailable
errors").  That 429 says nothing about the standard tier's limits, so it is
its own signal: ``temporary`` (waiting can help), ``code`` :data:`FLEX_UNAVAILABLE`,
``scope`` :data:`FLEX_SCOPE`, and no wait (the guide names none).  It is read
from the error code ``resource_unavailable`` (what clients of the API test
for) or the words "resource unavailable" in a 429's message.
"""

from __future__ import annotations

import re

from rateloop.classify._evidence import Evidence, Finding, error_object
from rateloop.classify._rules import code_of, message_of, throttle
from rateloop.signal import Kind

__all__ = ["FLEX_SCOPE", "FLEX_UNAVAILABLE", "rule"]

#: The ``code`` of a signal read from a flex-capacity refusal: the flex tier had
#: no capacity for the request (not a limit of the account, not the standard tier's).
FLEX_UNAVAILABLE = "flex_unavailable"
#: The ``scope`` of that signal: the capacity pool that refused is the flex tier's.
FLEX_SCOPE = "tier:flex"

_RESOURCE_UNAVAILABLE = re.compile(r"\bresource[ _]unavailable\b", re.IGNORECASE)

_SPEND_CODES = frozenset(
    {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active", "credit_limit"}
)
_THROTTLE_CODES = frozenset(
    {"rate_limit_exceeded", "ratelimitreached", "rate_limited", "tokens", "requests",
     "tokens_usage_based"}
)
_PERMISSION_CODES = frozenset(
    {"invalid_api_key", "invalid_authentication", "account_deactivated",
     "organization_deactivated", "unsupported_country_region_territory"}
)
# content_filter (Azure): the prompt must change, whatever status a relay gives it.
_INVALID_CODES = frozenset(
    {"model_not_found", "context_length_exceeded", "invalid_prompt", "content_filter"}
)


def rule(ev: Evidence) -> Finding | None:
    message = message_of(ev)
    if ev.status == 503 and "engine is currently overloaded" in message.lower():
        return Finding(
            kind=Kind.OVERLOAD, code=code_of(ev), matched="engine is currently overloaded"
        )
    err = error_object(ev.data)
    if err is None:
        return None
    if ev.status == 429 and (
        err.get("code") == "resource_unavailable" or _RESOURCE_UNAVAILABLE.search(message)
    ):
        return Finding(kind=Kind.TEMPORARY, code=FLEX_UNAVAILABLE, matched="resource unavailable",
                       scope=FLEX_SCOPE)
    codes = {str(err[k]).lower() for k in ("code", "type") if isinstance(err.get(k), str | int)}
    code = code_of(ev)
    if hits := sorted(codes & _SPEND_CODES):
        return Finding(kind=Kind.SPEND, code=code, matched=hits[0])
    if "usage_limit_reached" in codes:
        # Codex (ChatGPT plans): a plan window is spent, however soon it resets;
        # resets_at / resets_in_seconds in the body say when.
        return Finding(kind=Kind.PERIOD_QUOTA, code=code, matched="usage_limit_reached")
    if ev.status is not None and ev.status >= 400 and (hits := sorted(codes & _THROTTLE_CODES)):
        return throttle(ev, message=message, code=code, matched=hits[0])
    if hits := sorted(codes & _PERMISSION_CODES):
        return Finding(kind=Kind.PERMISSION, code=code, matched=hits[0])
    if ev.status is not None and ev.status >= 400 and (hits := sorted(codes & _INVALID_CODES)):
        return Finding(kind=Kind.INVALID, code=code, matched=hits[0])
    return None
