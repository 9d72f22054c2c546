"""Plain SDK clients for wrapping calls by hand: the SDK's own client, its retries off.

For a program that runs each call through ``RateLoop.call`` /
``AsyncRateLoop.call`` itself (fallback routes, a shared loop), the client
must not retry on its own: stacked retries multiply (an SDK that retries 3
times inside a loop that retries 5 times sends up to 20 requests).
:func:`plain_client` builds the SDK's client with ``max_retries=0`` (unless
given) and counts every request it sends, so the loop's attempt ledger sees
any retry the SDK still takes (:mod:`rateloop.loop.sdk_count`)::

    client = plain_client("openai", is_async=True, api_key=...)
    outcome = await loop.call(lambda route: client.chat.completions.create(...), route=route)

These are not the ready clients (``rateloop.openai_client()`` and friends,
:mod:`rateloop.integrations.clients`): those run every request through the
RATE loop inside their transport and need no loop around the call.  Both are
built by one builder (:mod:`rateloop.integrations._assemble`).
"""

from __future__ import annotations

from typing import Any, Literal

from rateloop.integrations._assemble import plain_sdk_client

__all__ = ["plain_client"]

_CLASSES = {
    ("openai", False): "OpenAI",
    ("openai", True): "AsyncOpenAI",
    ("anthropic", False): "Anthropic",
    ("anthropic", True): "AsyncAnthropic",
}


def plain_client(
    sdk: Literal["openai", "anthropic"], *, is_async: bool = False, **kwargs: Any
) -> Any:
    """``openai.OpenAI`` / ``AsyncOpenAI`` / ``anthropic.Anthropic`` / ``AsyncAnthropic``.

    ``kwargs`` go to the SDK; ``max_retries`` defaults to 0 (rateloop retries).
    """
    cls = _CLASSES.get((sdk, bool(is_async)))
    if cls is None:
        raise ValueError(f"sdk must be 'openai' or 'anthropic', got {sdk!r}")
    return plain_sdk_client(sdk, cls, is_async=bool(is_async), kwargs=kwargs)
