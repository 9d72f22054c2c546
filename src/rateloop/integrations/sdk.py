"""SDK retry ownership.

Stacked retries multiply: an SDK that retries 3 times inside a loop that
retries 5 times sends up to 20 requests.  rateloop owns the retries, so the
helpers here build OpenAI and Anthropic clients with ``max_retries=0``.

Where a user keeps SDK retries on, the attempt ledger still learns how many
requests the provider saw:

- a client built by these helpers counts every request it sends (an httpx
  request hook); the loop reads the count around each attempt, so retries
  inside a *successful* attempt are counted too (:func:`counting_requests`);
- otherwise :func:`sdk_retries_taken` reads a raw response's
  ``retries_taken`` (``with_raw_response``), or the ``x-stainless-retry-count``
  header of the last request an SDK error kept.
"""

from __future__ import annotations

from typing import Any

from rateloop.loop.sdk_count import (
    acount_request,
    count_request,
    counting_requests,
    sdk_retries_taken,
)


def _counted(client: Any, *, is_async: bool) -> Any:
    """Add the request-counting hook to an SDK client's underlying httpx client."""
    hooks = getattr(getattr(client, "_client", None), "event_hooks", None)
    if isinstance(hooks, dict):
        hooks.setdefault("request", []).append(acount_request if is_async else count_request)
    return client

__all__ = [
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "counting_requests",
    "openai_client",
    "sdk_retries_taken",
]


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
    return _counted(_need("openai", "openai").OpenAI(**kwargs), is_async=False)


def async_openai_client(**kwargs: Any) -> Any:
    """An ``openai.AsyncOpenAI`` client whose own retries are off."""
    kwargs.setdefault("max_retries", 0)
    return _counted(_need("openai", "openai").AsyncOpenAI(**kwargs), is_async=True)


def anthropic_client(**kwargs: Any) -> Any:
    """An ``anthropic.Anthropic`` client whose own retries are off."""
    kwargs.setdefault("max_retries", 0)
    return _counted(_need("anthropic", "anthropic").Anthropic(**kwargs), is_async=False)


def async_anthropic_client(**kwargs: Any) -> Any:
    """An ``anthropic.AsyncAnthropic`` client whose own retries are off."""
    kwargs.setdefault("max_retries", 0)
    return _counted(_need("anthropic", "anthropic").AsyncAnthropic(**kwargs), is_async=True)
