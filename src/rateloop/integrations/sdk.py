"""SDK retry ownership.

Stacked retries multiply: an SDK that retries 3 times inside a loop that
retries 5 times sends up to 20 requests.  rateloop owns the retries, so the
helpers here build OpenAI and Anthropic clients with ``max_retries=0``.

Where a user keeps SDK retries on, :func:`sdk_retries_taken` reads how many
retries the SDK took inside one attempt, for the attempt ledger:

- a raw response (``with_raw_response``) exposes ``retries_taken``;
- every request the OpenAI and Anthropic SDKs send carries the header
  ``x-stainless-retry-count``; an ``APIStatusError`` keeps the last
  response, whose request tells the count.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "openai_client",
    "sdk_retries_taken",
]


def sdk_retries_taken(obj: object) -> int:
    """Retries an SDK took for ``obj`` (response, raw response or exception); 0 if unknown."""
    for name in ("retries_taken", "_retries_taken"):
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    response = getattr(obj, "response", None)
    request = getattr(response, "request", None) if response is not None else None
    headers = getattr(request, "headers", None)
    if headers is not None:
        try:
            raw = headers.get("x-stainless-retry-count")
        except Exception:
            raw = None
        if raw is not None:
            try:
                count = int(raw)
            except (TypeError, ValueError):
                return 0
            return max(count, 0)
    return 0


def _need(module: str, extra: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise ImportError(
            f"this helper needs the {module!r} package: pip install 'rateloop[{extra}]'"
        ) from exc


def openai_client(**kwargs: Any) -> Any:
    """An ``openai.OpenAI`` client whose own retries are off (rateloop retries)."""
    kwargs.setdefault("max_retries", 0)
    return _need("openai", "openai").OpenAI(**kwargs)


def async_openai_client(**kwargs: Any) -> Any:
    """An ``openai.AsyncOpenAI`` client whose own retries are off."""
    kwargs.setdefault("max_retries", 0)
    return _need("openai", "openai").AsyncOpenAI(**kwargs)


def anthropic_client(**kwargs: Any) -> Any:
    """An ``anthropic.Anthropic`` client whose own retries are off."""
    kwargs.setdefault("max_retries", 0)
    return _need("anthropic", "anthropic").Anthropic(**kwargs)


def async_anthropic_client(**kwargs: Any) -> Any:
    """An ``anthropic.AsyncAnthropic`` client whose own retries are off."""
    kwargs.setdefault("max_retries", 0)
    return _need("anthropic", "anthropic").AsyncAnthropic(**kwargs)
