"""Which provider a response came from, when the caller does not say.

Tried in order, first hit wins: headers only one provider sends
(``anthropic-ratelimit-*``, ``x-amzn-errortype``, ``x-groq-region``,
``x-github-request-id`` …); then the body's shape (Anthropic's
``{"type": "error"}``, Google's ``error.status``, Bedrock's ``__type``,
OpenRouter's ``error.metadata``, Slack's ``{"ok": false}``); then a provider's
own domain named in the body text.  ``None`` when nothing is conclusive.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from rateloop.classify._evidence import (
    BodyLike,
    HeadersLike,
    error_object,
    normalize_headers,
    read_body,
)

__all__ = ["PROVIDERS", "detect", "detect_provider"]

#: Every provider name classifiers report.
PROVIDERS = (
    "anthropic",
    "atlassian",
    "azure",
    "bedrock",
    "brave",
    "cerebras",
    "cohere",
    "deepseek",
    "discord",
    "github",
    "google",
    "groq",
    "minimax",
    "mistral",
    "moonshot",
    "notion",
    "ollama",
    "openai",
    "openrouter",
    "slack",
    "together",
    "xai",
    "zhipu",
)

_HEADER_MARKS: tuple[tuple[str, str], ...] = (
    ("anthropic-", "anthropic"),
    ("x-amzn-errortype", "bedrock"),
    ("x-amzn-bedrock-", "bedrock"),
    ("x-groq-", "groq"),
    ("x-github-", "github"),
    ("x-slack-", "slack"),
    ("apim-request-id", "azure"),
    ("x-ms-region", "azure"),
    ("x-ms-rai-invoked", "azure"),
    ("azureml-model-session", "azure"),
    ("x-ms-retry-after-ms", "azure"),
    ("openai-", "openai"),
    ("x-codex-", "openai"),
    ("x-ratelimitbysize-", "mistral"),
    ("mistral-correlation-id", "mistral"),
    ("x-tokenlimit-", "together"),
    ("x-together-", "together"),
    ("x-trial-endpoint-call-", "cohere"),
    ("x-endpoint-monthly-call-", "cohere"),
    ("x-goog-", "google"),
    ("x-ratelimit-limit-requests-day", "cerebras"),
    ("x-ratelimit-limit-tokens-minute", "cerebras"),
    ("x-gemini-", "google"),
    ("x-amzn-requestid", "bedrock"),
    # Tool APIs (rateloop.classify.tools).
    ("x-ratelimit-bucket", "discord"),
    ("x-ratelimit-global", "discord"),
    ("x-ratelimit-scope", "discord"),
    ("x-notion-request-id", "notion"),
    ("ratelimit-reason", "atlassian"),
    ("x-beta-ratelimit-reason", "atlassian"),
    ("x-ratelimit-policy", "brave"),  # Brave's second and month windows ("1;w=1, 15000;w=2592000")
)

#: How much of the body text is searched for a provider's domain.
_MENTION_CHARS = 20_000
_MENTIONS: tuple[tuple[str, str], ...] = (
    ("azure openai", "azure"),
    ("minimax", "minimax"),
    ("bigmodel.cn", "zhipu"),
    ("api.z.ai", "zhipu"),
    ("moonshot", "moonshot"),
    ("cerebras", "cerebras"),
    ("ollama.com", "ollama"),
    ("openrouter", "openrouter"),
    ("groq.com", "groq"),
    ("anthropic.com", "anthropic"),
    ("deepseek", "deepseek"),
    ("mistral", "mistral"),
    ("together.ai", "together"),
    ("api.together", "together"),
    ("console.x.ai", "xai"),
    ("docs.x.ai", "xai"),
    ("cohere", "cohere"),
    ("ai.google.dev", "google"),
    ("googleapis.com", "google"),
    ("docs.github.com", "github"),
    ("openai.com", "openai"),
    ("discord.com/developers", "discord"),
    ("developers.notion.com", "notion"),
    ("developer.atlassian.com", "atlassian"),
    ("api.search.brave.com", "brave"),
)

_GOOGLE_STATUSES = frozenset(
    {
        "RESOURCE_EXHAUSTED",
        "UNAVAILABLE",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "NOT_FOUND",
        "INTERNAL",
        "DEADLINE_EXCEEDED",
        "ABORTED",
        "CANCELLED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "ALREADY_EXISTS",
    }
)


def _tool_shape(data: Mapping[str, Any]) -> str | None:
    """Discord's ``{"message", "retry_after", "global"}``, Notion's ``{"object": "error",
    "status": 429, "code": ...}`` (no ``type``: Mistral's has one), Brave's ``ErrorResponse``."""
    if isinstance(data.get("global"), bool) and "retry_after" in data:
        return "discord"
    if (
        data.get("object") == "error"
        and isinstance(data.get("status"), int)
        and isinstance(data.get("code"), str)
        and "type" not in data
    ):
        return "notion"
    if data.get("type") == "ErrorResponse" and isinstance(data.get("error"), Mapping):
        return "brave"
    return None


def _from_shape(data: Any) -> str | None:
    if isinstance(data, Mapping):
        if data.get("type") == "error" and isinstance(data.get("error"), Mapping):
            return "anthropic"
        if "__type" in data:
            return "bedrock"
        if data.get("ok") is False and isinstance(data.get("error"), str):
            return "slack"
        tool = _tool_shape(data)
        if tool is not None:
            return tool
    err = error_object(data)
    if err is None:
        return None
    if isinstance(err.get("status"), str) and err["status"] in _GOOGLE_STATUSES:
        return "google"
    if isinstance(err.get("metadata"), Mapping):
        return "openrouter"
    if isinstance(data, Mapping) and isinstance(data.get("base_resp"), Mapping):
        return "minimax"
    return None


def _header_mark(headers: Mapping[str, str]) -> str | None:
    """The provider of the first mark (in :data:`_HEADER_MARKS` order) a header name starts with.

    The names are sorted once and each mark looked up by bisection: the names
    that start with a mark sort right after it.  Trying every mark against
    every name took ~0.2 s on a response with 100 000 fields.
    """
    names = sorted(headers)
    for mark, provider in _HEADER_MARKS:
        index = bisect_left(names, mark)
        if index < len(names) and names[index].startswith(mark):
            return provider
    return None


def detect(headers: Mapping[str, str], data: Any, text: str) -> str | None:
    """Detection over already-normalized evidence (lowercase header names)."""
    provider = _header_mark(headers)
    if provider is not None:
        return provider
    shaped = _from_shape(data)
    if shaped is not None:
        return shaped
    lowered = text[:_MENTION_CHARS].lower()
    for mark, provider in _MENTIONS:
        if mark in lowered:
            return provider
    return None


def detect_provider(headers: HeadersLike, body: BodyLike) -> str | None:
    """The provider a response came from, from its headers and body, or ``None``.

    The body is read as :func:`~rateloop.classify.classify` reads it: its
    first :data:`~rateloop.classify._evidence.MAX_BODY_CHARS` characters.
    """
    norm = normalize_headers(headers)
    marked = _header_mark(norm)
    if marked is not None:  # the headers decide: the body need not be decoded
        return marked
    if not isinstance(body, Mapping | bytes | bytearray | str):
        return detect(norm, None, "")
    text, data, sse = read_body(body)
    return detect(norm, None if sse else data, text)
