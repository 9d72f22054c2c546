"""What an outgoing HTTP request means to the RATE loop: its route, cost and kind.

How it works: :func:`read_request` looks at a request before it is sent —
method, URL, headers and the JSON body — and returns a :class:`RequestPlan`:

1. the **provider** from the host (``api.openai.com`` …) or, for a
   compatible server elsewhere, from the path shape (``/chat/completions``,
   ``/messages``, ``:generateContent``);
2. the **model** from the body's ``model`` or the Gemini path
   (``/models/<model>:generateContent``);
3. the **scope's project**: the host and a short fingerprint of the base URL
   and the API key, so two keys (two provider projects) never share a bucket
   and the key itself never leaves this function;
4. the **cost**: one request, the prompt's tokens (``tiktoken`` when it is
   installed and its encoding is available offline, else about four bytes a
   token) and the output ceiling (``max_tokens``, ``max_completion_tokens``,
   ``max_output_tokens`` or Gemini's ``generationConfig.maxOutputTokens``);
5. whether the call is a **model call** (idempotent: running it again is
   safe) or another POST, which follows the loop's unknown-outcome rule.

:func:`body_at_tier` is the other way round: the body an attempt sends at its
route's service tier, when the degrade ladder moved it (OpenAI's
``service_tier``).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rateloop.classify._evidence import iter_strings
from rateloop.route import Cost, Route

__all__ = ["RequestPlan", "body_at_tier", "estimate_tokens", "key_fingerprint", "read_request"]

_HOSTS = {
    "api.openai.com": "openai",
    "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "google",
    "aiplatform.googleapis.com": "google",
    "api.mistral.ai": "mistral",
    "api.groq.com": "groq",
    "api.deepseek.com": "deepseek",
    "api.x.ai": "xai",
    "openrouter.ai": "openrouter",
}

# Path endings of calls that run a model.  Running one twice costs tokens but
# changes nothing, so the loop may retry it; any other POST may be a write.
_MODEL_PATHS = (
    "/chat/completions",
    "/completions",
    "/responses",
    "/embeddings",
    "/messages",
    "/messages/count_tokens",
    ":generateContent",
    ":streamGenerateContent",
    ":embedContent",
    ":batchEmbedContents",
    ":countTokens",
)

# Body keys holding the prompt, across the three API families.
_PROMPT_KEYS = frozenset(
    {"messages", "input", "contents", "system", "prompt", "instructions", "tools",
     "system_instruction", "systemInstruction"}
)
_OUTPUT_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens", "maxOutputTokens")
_NO_MODEL = "any"


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestPlan:
    """How the loop sees one request: where it goes, what it costs, how to retry it."""

    route: Route
    cost: Cost
    operation: str
    idempotent: bool
    model_call: bool
    stream: bool


def key_fingerprint(origin: str, key: str | None) -> str:
    """A short, stable fingerprint of a base URL and an API key (never the key).

    >>> key_fingerprint("https://api.openai.com", "sk-secret") == key_fingerprint(
    ...     "https://api.openai.com", "sk-secret")
    True
    >>> "secret" in key_fingerprint("https://api.openai.com", "sk-secret")
    False
    """
    digest = hashlib.sha256(f"{origin}\0{key or ''}".encode()).hexdigest()
    return digest[:10]


def _api_key(headers: Mapping[str, str], query: str) -> str | None:
    auth = headers.get("authorization")
    if auth:
        return auth.split(" ", 1)[-1].strip()
    for name in ("x-api-key", "x-goog-api-key", "api-key"):
        value = headers.get(name)
        if value:
            return value
    keys = parse_qs(query).get("key")
    return keys[0] if keys else None


def _provider(host: str, path: str) -> str:
    known = _HOSTS.get(host)
    if known is not None:
        return known
    if host.endswith(".openai.azure.com"):
        return "azure"
    if "/messages" in path:
        return "anthropic"
    if ":generateContent" in path or ":streamGenerateContent" in path or "/models/" in path:
        return "google" if ":" in path.rsplit("/", 1)[-1] else "openai"
    return "openai"


def _path_model(path: str) -> str | None:
    # Gemini: /v1beta/models/gemini-2.5-flash:generateContent
    if "/models/" not in path:
        return None
    tail = path.rsplit("/models/", 1)[1]
    model = tail.split(":", 1)[0].split("/", 1)[0]
    return model or None


def _safe(name: str) -> str:
    """A model name usable in a scope key (scopes are ``:``-separated)."""
    cleaned = name.strip().replace(":", "_")
    return cleaned[:200] or _NO_MODEL


@cache
def _encoding(model: str) -> Any:
    """A tiktoken encoding when tiktoken is installed and its files are at hand; else None."""
    try:
        import tiktoken  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    try:
        try:
            return tiktoken.encoding_for_model(model)
        except KeyError:
            return tiktoken.get_encoding("o200k_base")
    except Exception:  # no encoding file cached and no network: the byte estimate will do
        return None


def estimate_tokens(text: str, model: str = "") -> int:
    """Tokens in ``text``: tiktoken when available, else about four UTF-8 bytes a token.

    >>> estimate_tokens("") == 0
    True
    >>> estimate_tokens("x" * 400, model="no-such-model") > 0
    True
    """
    if not text:
        return 0
    encoding = _encoding(model)
    if encoding is not None:
        return len(encoding.encode(text, disallowed_special=()))
    return -(-len(text.encode()) // 4)


def _prompt_tokens(body: Mapping[str, Any], model: str) -> int:
    texts = [
        s
        for key, value in body.items()
        if key in _PROMPT_KEYS
        for s in iter_strings(value, max_depth=12)
    ]
    messages = body.get("messages") or body.get("contents") or body.get("input")
    overhead = 4 * len(messages) if isinstance(messages, list) else 0
    return estimate_tokens("\n".join(texts), model) + overhead


def _max_output(body: Mapping[str, Any]) -> int:
    for scope in (body, body.get("generationConfig"), body.get("generation_config")):
        if not isinstance(scope, Mapping):
            continue
        for key in _OUTPUT_KEYS:
            value = scope.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    return 0


def read_request(
    method: str, url: str, headers: Mapping[str, str], content: bytes
) -> RequestPlan:
    """The loop's view of a request (``headers`` must match names case-insensitively).

    >>> plan = read_request("POST", "https://api.openai.com/v1/chat/completions",
    ...     {"authorization": "Bearer sk-x"},
    ...     b'{"model": "gpt-4o-mini", "max_tokens": 50, "messages": []}')
    >>> plan.route.provider, plan.route.model, plan.cost.output_tokens, plan.model_call
    ('openai', 'gpt-4o-mini', 50, True)
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    path = parts.path
    body: Any = None
    if content and content[:1] in (b"{", b" ", b"\n"):
        try:
            body = json.loads(content)
        except ValueError:
            body = None
    if not isinstance(body, Mapping):
        body = {}
    provider = _provider(host, path)
    raw_model = body.get("model")
    model = raw_model if isinstance(raw_model, str) and raw_model else _path_model(path)
    model = _safe(model) if model else _NO_MODEL
    origin = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
    fingerprint = key_fingerprint(origin, _api_key(headers, parts.query))
    project = f"{host.replace(':', '_') or 'local'}-{fingerprint}"
    # OpenAI's flex processing has capacity of its own: the route's tier keeps it apart.
    tier = "flex" if body.get("service_tier") == "flex" else "standard"
    route = Route(provider=provider, model=model, project=project, tier=tier)
    method = method.upper()
    model_call = method == "POST" and path.endswith(_MODEL_PATHS)
    stream = body.get("stream") is True or ":streamGenerateContent" in path
    if model_call:
        cost = Cost(input_tokens=_prompt_tokens(body, model), output_tokens=_max_output(body))
        operation = "model.generate"
    else:
        cost = Cost()
        operation = f"http.{method.lower()}"
    return RequestPlan(
        route=route,
        cost=cost,
        operation=operation,
        # GET, HEAD, PUT, DELETE, OPTIONS are idempotent by HTTP; PATCH and other POSTs are not.
        idempotent=model_call or method in ("GET", "HEAD", "PUT", "DELETE", "OPTIONS"),
        model_call=model_call,
        stream=stream,
    )


def body_at_tier(content: bytes, provider: str, tier: str) -> bytes | None:
    """An OpenAI model call's body for an attempt at ``tier``; None when it goes as it is.

    The flex rung sets ``"service_tier": "flex"``; a body that asked for flex
    and is moved to the standard tier asks for ``"default"`` (the standard
    tier by name, never the project's own default, which may be another tier).
    Other providers, and bodies that are not a JSON object, are never changed.

    >>> body_at_tier(b'{"model": "gpt-5"}', "openai", "flex")
    b'{"model": "gpt-5", "service_tier": "flex"}'
    >>> body_at_tier(b'{"model": "gpt-5", "service_tier": "flex"}', "openai", "standard")
    b'{"model": "gpt-5", "service_tier": "default"}'
    >>> body_at_tier(b'{"model": "gpt-5"}', "openai", "standard") is None
    True
    """
    if provider != "openai" or content[:1] not in (b"{", b" ", b"\n"):
        return None
    try:
        body = json.loads(content)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    asked = body.get("service_tier")
    if tier == "flex" and asked != "flex":
        body["service_tier"] = "flex"
    elif tier == "standard" and asked == "flex":
        body["service_tier"] = "default"
    else:
        return None
    return json.dumps(body).encode()
