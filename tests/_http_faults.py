"""Provider refusals as the SDKs raise them, shared by the loop's tests."""

from __future__ import annotations

import httpx

OPENAI = "https://api.openai.com/v1/chat/completions"


def throttle(retry_after: str) -> httpx.HTTPStatusError:
    """An OpenAI 429 with ``retry-after``, raised as httpx raises it."""
    request = httpx.Request("POST", OPENAI)
    resp = httpx.Response(
        429,
        headers={"retry-after": retry_after},
        json={"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}},
        request=request,
    )
    return httpx.HTTPStatusError("429", request=request, response=resp)
