"""OpenAI, Azure OpenAI and the OpenAI-compatible error bodies (Groq, Together, DeepSeek …).

Errors look like ``{"error": {"message", "type", "param", "code"}}``.  The code
decides first: ``insufficient_quota`` is spend however it is phrased;
``rate_limit_exceeded`` (and Groq's ``type: tokens|requests``) is a throttle
whose window and dimension come from the message ("tokens per min (TPM)",
"requests per day (RPD)") and whose minimum wait is "Please try again in 20ms"
(OpenAI) or "Please retry after 6 seconds" (Azure).  A 503 "The engine is
currently overloaded" is overload.
"""

from __future__ import annotations

from rateloop.classify._evidence import Evidence, Finding, error_object
from rateloop.classify._rules import code_of, message_of, throttle
from rateloop.signal import Kind

__all__ = ["rule"]

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
