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

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# Requests sent by helper-built clients during the current attempt (None: not counting).
_requests_seen: ContextVar[list[int] | None] = ContextVar("rateloop_sdk_requests", default=None)


@contextmanager
def counting_requests() -> Iterator[list[int]]:
    """Count the requests helper-built clients send inside the block: ``box[0]``."""
    box = [0]
    token = _requests_seen.set(box)
    try:
        yield box
    finally:
        _requests_seen.reset(token)


def _on_request(request: object) -> None:
    box = _requests_seen.get()
    if box is not None:
        box[0] += 1


async def _aon_request(request: object) -> None:
    _on_request(request)


def _counted(client: Any, *, is_async: bool) -> Any:
    """Add the request-counting hook to an SDK client's underlying httpx client."""
    hooks = getattr(getattr(client, "_client", None), "event_hooks", None)
    if isinstance(hooks, dict):
        hooks.setdefault("request", []).append(_aon_request if is_async else _on_request)
    return client

__all__ = [
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "counting_requests",
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
