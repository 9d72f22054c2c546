"""What the fake provider says, in each provider's own shape.

The bodies and headers follow the providers' documentation and the canned
responses in ``tests/fixtures/classify`` (themselves taken from the docs and
the SDKs' tests):

- OpenAI (platform.openai.com/docs/guides/rate-limits, /error-codes):
  ``{"error": {"message", "type", "param", "code"}}``; a throttle is 429
  ``rate_limit_exceeded`` whose message names "requests per min (RPM)" and
  says "Please try again in 1.2s"; ``retry-after`` / ``retry-after-ms`` and
  ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets in Go
  duration form, ``6m0s``, ``20ms``) on refusals and successes.
- Anthropic (docs.claude.com/en/api/rate-limits, /errors):
  ``{"type": "error", "error": {"type", "message"}, "request_id"}``, 429
  ``rate_limit_error`` with ``retry-after`` (seconds) and
  ``anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}``
  (resets in RFC 3339); 529 ``overloaded_error``; streams break with
  ``event: error``.
- Gemini (ai.google.dev/gemini-api/docs/troubleshooting): 429
  ``RESOURCE_EXHAUSTED`` with a ``google.rpc.QuotaFailure`` violation naming
  the quota (``GenerateRequestsPerMinutePerProjectPerModel``) and a
  ``google.rpc.RetryInfo`` ``retryDelay``; 503 ``UNAVAILABLE`` "The model is
  overloaded"; no rate-limit headers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from rateloop.testing._fake.buckets import Bucket, Profile
from rateloop.testing._fake.model import FakeResponse

__all__ = ["go_duration", "rate_headers", "refusal", "stream_error_chunk", "success"]

_JSON = {"content-type": "application/json"}

# dimension -> (OpenAI message phrase, OpenAI error type)
_OPENAI_PHRASE = {
    "requests": ("requests per min (RPM)", "requests"),
    "tokens": ("tokens per min (TPM)", "tokens"),
    "input_tokens": ("input tokens per min", "tokens"),
    "output_tokens": ("output tokens per min", "tokens"),
    "requests_per_day": ("requests per day (RPD)", "requests"),
}
_ANTHROPIC_PHRASE = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "input_tokens": "input tokens per minute",
    "output_tokens": "output tokens per minute",
    "requests_per_day": "requests per day",
}
_GEMINI_QUOTA = {
    "requests": ("GenerateRequestsPerMinutePerProjectPerModel", "generate_content_requests"),
    "tokens": ("GenerateContentInputTokensPerModelPerMinute", "generate_content_input_token_count"),
    "input_tokens": (
        "GenerateContentInputTokensPerModelPerMinute",
        "generate_content_input_token_count",
    ),
    "output_tokens": (
        "GenerateContentOutputTokensPerModelPerMinute",
        "generate_content_output_token_count",
    ),
    "requests_per_day": ("GenerateRequestsPerDayPerProjectPerModel", "generate_content_requests"),
}
_HEADER_DIMS = {  # bucket name -> (OpenAI suffix, Anthropic infix)
    "requests": ("requests", "requests"),
    "tokens": ("tokens", "tokens"),
    "input_tokens": (None, "input-tokens"),
    "output_tokens": (None, "output-tokens"),
}


def go_duration(seconds: float) -> str:
    """A wait as OpenAI writes it: ``20ms``, ``1.5s``, ``6m0s``, ``1h2m3s``.

    >>> go_duration(0.02), go_duration(1.5), go_duration(360), go_duration(3723)
    ('20ms', '1.5s', '6m0s', '1h2m3s')
    >>> go_duration(59.9999), go_duration(119.9996), go_duration(3599.9999), go_duration(1.0004)
    ('1m0s', '2m0s', '1h0m0s', '1.001s')
    """
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    # Whole milliseconds first (rounded up, as under a second: a wait is never told
    # short), so that 119.9996 s reads 2m0s, never 1m60s.
    hours, rest = divmod(math.ceil(round(seconds * 1000, 6)), 3_600_000)
    minutes, millis = divmod(rest, 60_000)
    secs_text = f"{millis / 1000:g}s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{secs_text}"
    if minutes:
        return f"{int(minutes)}m{secs_text}"
    return secs_text


def _rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def rate_headers(
    profile: Profile, buckets: Mapping[str, Bucket], now: datetime
) -> dict[str, str]:
    """The rate-limit headers of a response, from the buckets' state."""
    headers: dict[str, str] = {}
    if profile == "gemini":
        return headers
    for name, bucket in buckets.items():
        if name not in _HEADER_DIMS:
            continue
        openai_suffix, anthropic_infix = _HEADER_DIMS[name]
        if profile == "openai" and openai_suffix is not None:
            headers[f"x-ratelimit-limit-{openai_suffix}"] = str(bucket.limit)
            headers[f"x-ratelimit-remaining-{openai_suffix}"] = str(bucket.remaining())
            headers[f"x-ratelimit-reset-{openai_suffix}"] = go_duration(bucket.seconds_to_full())
        elif profile == "anthropic":
            reset = now + timedelta(seconds=math.ceil(bucket.seconds_to_full()))
            headers[f"anthropic-ratelimit-{anthropic_infix}-limit"] = str(bucket.limit)
            headers[f"anthropic-ratelimit-{anthropic_infix}-remaining"] = str(bucket.remaining())
            headers[f"anthropic-ratelimit-{anthropic_infix}-reset"] = _rfc3339(reset)
    return headers


def _response(
    status: int,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    refused: str,
) -> FakeResponse:
    return FakeResponse(
        status_code=status,
        headers={**_JSON, **headers},
        content=json.dumps(body).encode(),
        refused=refused,
    )


def _wait_headers(profile: Profile, wait: float | None) -> dict[str, str]:
    if wait is None or profile == "gemini":
        return {}
    headers = {"retry-after": str(max(1, math.ceil(wait)))}
    if profile == "openai":
        headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
    return headers


def refusal(
    profile: Profile,
    reason: str,
    *,
    model: str,
    request_id: str,
    wait: float | None = None,
    limit: int | None = None,
    requested: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> FakeResponse:
    """A refusal for ``reason``: a limit dimension or a fault name."""
    extra = {**(headers or {}), **_wait_headers(profile, wait)}
    if profile == "openai":
        extra["x-request-id"] = request_id
        return _openai_refusal(reason, model, wait, limit, requested, extra)
    if profile == "anthropic":
        extra["request-id"] = request_id
        if reason != "spend":
            extra["x-should-retry"] = "true"  # as the API sends on 429 and 529
        return _anthropic_refusal(reason, wait, limit, request_id, extra)
    return _gemini_refusal(reason, model, wait, limit, extra)


def _openai_refusal(
    reason: str,
    model: str,
    wait: float | None,
    limit: int | None,
    requested: int | None,
    headers: dict[str, str],
) -> FakeResponse:
    if reason == "spend":
        message = (
            "You exceeded your current quota, please check your plan and billing details. "
            "For more information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors."
        )
        err = {"message": message, "type": "insufficient_quota", "param": None,
               "code": "insufficient_quota"}
        return _response(429, {"error": err}, headers, reason)
    if reason == "overload":
        err = {"message": "The engine is currently overloaded, please try again later",
               "type": "server_error", "param": None, "code": None}
        return _response(503, {"error": err}, headers, reason)
    if reason in ("server_error", "stream_error"):
        err = {"message": "The server had an error while processing your request. Sorry about "
               "that!", "type": "server_error", "param": None, "code": None}
        return _response(500, {"error": err}, headers, reason)
    if reason == "resource_unavailable":
        # The flex guide (developers.openai.com/api/docs/guides/flex-processing, "Resource
        # unavailable errors"): "a `429 Resource Unavailable` error code", not charged,
        # met by backing off or by retrying at the standard tier.  The guide prints no
        # body; clients test `error.code === "resource_unavailable"`.  No retry-after:
        # the guide names no wait.  No words of overload either (that would read as one).
        message = (f"Resource Unavailable: flex processing has no capacity for {model} right "
                   "now. Retry later with exponential backoff, or send the request with "
                   'service_tier "auto" for standard processing.')
        err = {"message": message, "type": "resource_unavailable", "param": None,
               "code": "resource_unavailable"}
        return _response(429, {"error": err}, headers, reason)
    if reason == "flex_unsupported":
        # As for a model without flex (Azure documents a 400 invalid_request_error that
        # does not fall back to standard processing); the wording is the fake's own.
        err = {"message": f"service_tier 'flex' is not available for the model {model}.",
               "type": "invalid_request_error", "param": "service_tier",
               "code": "invalid_value"}
        return _response(400, {"error": err}, headers, reason)
    if reason == "concurrency":
        err = {"message": f"Too many concurrent requests for {model}. Limit {limit}.",
               "type": "requests", "param": None, "code": "rate_limit_exceeded"}
        return _response(429, {"error": err}, headers, reason)
    dim = "requests_per_day" if reason == "period_quota" else reason
    if dim == "rate_limit":
        dim = "requests"
    phrase, kind = _OPENAI_PHRASE.get(dim, _OPENAI_PHRASE["requests"])
    try_again = f" Please try again in {go_duration(wait)}." if wait is not None else ""
    # A scripted fault has no bucket behind it: name a plausible limit, never one below
    # the request (that would read as a request too large for any window).
    shown = limit if limit is not None else (10_000 if dim == "requests_per_day" else 500)
    message = (
        f"Rate limit reached for {model} in organization org-fake on {phrase}: "
        f"Limit {shown}, Used {shown}, "
        f"Requested {requested if requested is not None else 1}.{try_again} "
        "Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    err = {"message": message, "type": kind, "param": None, "code": "rate_limit_exceeded"}
    return _response(429, {"error": err}, headers, reason)


def _anthropic_refusal(
    reason: str,
    wait: float | None,
    limit: int | None,
    request_id: str,
    headers: dict[str, str],
) -> FakeResponse:
    def body(kind: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message},
                "request_id": request_id}

    if reason == "spend":
        message = ("Your credit balance is too low to access the Anthropic API. Please go to "
                   "Plans & Billing to upgrade or purchase credits.")
        return _response(400, body("invalid_request_error", message), headers, reason)
    if reason in ("overload", "stream_error"):
        return _response(529, body("overloaded_error", "Overloaded"), headers, reason)
    if reason == "server_error":
        return _response(500, body("api_error", "Internal server error"), headers, reason)
    if reason == "concurrency":
        message = f"Number of concurrent connections has exceeded your rate limit of {limit}."
        return _response(429, body("rate_limit_error", message), headers, reason)
    dim = "requests_per_day" if reason == "period_quota" else reason
    if dim == "rate_limit":
        dim = "requests"
    phrase = _ANTHROPIC_PHRASE.get(dim, _ANTHROPIC_PHRASE["requests"])
    amount = f"{limit:,}" if limit is not None else "your"
    message = (
        f"This request would exceed the rate limit for your organization of {amount} {phrase}. "
        "For details, refer to: https://docs.claude.com/en/api/rate-limits."
    )
    return _response(429, body("rate_limit_error", message), headers, reason)


def _gemini_refusal(
    reason: str,
    model: str,
    wait: float | None,
    limit: int | None,
    headers: dict[str, str],
) -> FakeResponse:
    def body(code: int, status: str, message: str, details: list[Any]) -> dict[str, Any]:
        err: dict[str, Any] = {"code": code, "message": message, "status": status}
        if details:
            err["details"] = details
        return {"error": err}

    if reason == "spend":
        message = ("Your project has exceeded its spending cap. Check your billing details "
                   "at https://console.cloud.google.com/billing.")
        return _response(429, body(429, "RESOURCE_EXHAUSTED", message, []), headers, reason)
    if reason in ("overload", "stream_error"):
        message = "The model is overloaded. Please try again later."
        return _response(503, body(503, "UNAVAILABLE", message, []), headers, reason)
    if reason == "server_error":
        message = "An internal error has occurred. Please retry or report in "\
            "https://developers.generativeai.google/guide/troubleshooting"
        return _response(500, body(500, "INTERNAL", message, []), headers, reason)
    if reason == "concurrency":
        message = "Too many concurrent requests. Please retry later."
        return _response(429, body(429, "RESOURCE_EXHAUSTED", message, []), headers, reason)
    dim = "requests_per_day" if reason == "period_quota" else reason
    if dim == "rate_limit":
        dim = "requests"
    quota_id, metric = _GEMINI_QUOTA.get(dim, _GEMINI_QUOTA["requests"])
    violation: dict[str, Any] = {
        "quotaMetric": f"generativelanguage.googleapis.com/{metric}",
        "quotaId": quota_id,
        "quotaDimensions": {"location": "global", "model": model},
    }
    if limit is not None:  # a scripted fault knows no limit: never state "0" (no quota at all)
        violation["quotaValue"] = str(limit)
    details: list[Any] = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [violation],
        },
        {
            "@type": "type.googleapis.com/google.rpc.Help",
            "links": [{"description": "Learn more about Gemini API quotas",
                       "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}],
        },
    ]
    if wait is not None:
        details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo",
                        "retryDelay": f"{max(1, math.ceil(wait))}s"})
    message = ("You exceeded your current quota, please check your plan and billing details. "
               "For more information on this error, head to: "
               "https://ai.google.dev/gemini-api/docs/rate-limits.")
    return _response(429, body(429, "RESOURCE_EXHAUSTED", message, details), headers, reason)


def success(
    profile: Profile,
    *,
    model: str,
    request_id: str,
    created: int,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    stream: bool,
    headers: Mapping[str, str],
    service_tier: str = "default",
) -> FakeResponse:
    """A 200 answer (never the prompt echoed back: tests must not leak prompts).

    An OpenAI answer echoes the tier that served it, as the API does
    (``"service_tier": "flex"``, else ``"default"``).
    """
    text = "fake response"
    head = dict(headers)
    if profile == "openai":
        head["x-request-id"] = request_id
        usage = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
                 "total_tokens": input_tokens + output_tokens}
        base = {"id": f"chatcmpl-{request_id}", "created": created, "model": model,
                "service_tier": service_tier}
        if not stream:
            body = {**base, "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text},
                 "finish_reason": "stop", "logprobs": None}], "usage": usage}
            return _ok(body, head)
        chunk = {**base, "object": "chat.completion.chunk"}
        events = [
            {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                   "finish_reason": None}]},
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
             "usage": usage},
        ]
        chunks = [f"data: {json.dumps(e)}\n\n".encode() for e in events]
        return _stream([*chunks, b"data: [DONE]\n\n"], head)
    if profile == "anthropic":
        head["request-id"] = request_id
        usage = {"input_tokens": max(0, input_tokens - cache_read_tokens),
                 "output_tokens": output_tokens, "cache_read_input_tokens": cache_read_tokens,
                 "cache_creation_input_tokens": 0}
        message = {"id": f"msg_{request_id}", "type": "message", "role": "assistant",
                   "model": model, "content": [{"type": "text", "text": text}],
                   "stop_reason": "end_turn", "stop_sequence": None, "usage": usage}
        if not stream:
            return _ok(message, head)
        start = {**message, "content": [], "stop_reason": None,
                 "usage": {**usage, "output_tokens": 1}}
        sse = [
            ("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": text}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                               "usage": {"output_tokens": output_tokens}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        return _stream([f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in sse], head)
    usage_meta = {"promptTokenCount": input_tokens, "candidatesTokenCount": output_tokens,
                  "totalTokenCount": input_tokens + output_tokens,
                  "cachedContentTokenCount": cache_read_tokens}
    body = {"candidates": [{"content": {"parts": [{"text": text}], "role": "model"},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage_meta, "modelVersion": model, "responseId": request_id}
    if not stream:
        return _ok(body, head)
    return _stream([f"data: {json.dumps(body)}\r\n\r\n".encode()], head)


def stream_error_chunk(profile: Profile, request_id: str) -> bytes:
    """The event that breaks a 200 stream (Anthropic documents ``event: error``)."""
    if profile == "anthropic":
        data = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},
                "request_id": request_id}
        return f"event: error\ndata: {json.dumps(data)}\n\n".encode()
    if profile == "openai":
        data = {"error": {"message": "The server had an error while processing your request.",
                          "type": "server_error", "param": None, "code": None}}
        return f"data: {json.dumps(data)}\n\n".encode()
    data = {"error": {"code": 503, "message": "The model is overloaded. Please try again later.",
                      "status": "UNAVAILABLE"}}
    return f"data: {json.dumps(data)}\r\n\r\n".encode()


def _ok(body: Mapping[str, Any], headers: Mapping[str, str]) -> FakeResponse:
    return FakeResponse(
        status_code=200, headers={**_JSON, **headers}, content=json.dumps(body).encode()
    )


def _stream(chunks: list[bytes], headers: Mapping[str, str]) -> FakeResponse:
    return FakeResponse(
        status_code=200,
        headers={"content-type": "text/event-stream", "cache-control": "no-cache", **headers},
        content=b"".join(chunks),
        chunks=chunks,
    )
