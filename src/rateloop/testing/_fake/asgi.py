"""The FakeProvider as an ASGI app: the providers' HTTP endpoints.

Routes (the shape follows the path, whatever the provider's default profile):

- ``POST /v1/chat/completions`` -- OpenAI (``stream: true`` streams SSE)
- ``POST /v1/messages`` -- Anthropic (``stream: true`` streams SSE)
- ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``
  -- Gemini (also under ``/v1/models/``)
- the batch endpoints (OpenAI ``/v1/files`` and ``/v1/batches``, Anthropic
  ``/v1/messages/batches``), answered by the provider's ``batch_route``
  (:mod:`~rateloop.testing._fake.batch_http`)
- ``GET /fake/stats`` -- the counters and the configuration, as JSON
- ``POST /fake/reset`` -- full buckets and empty counters

An OpenAI request's ``service_tier`` is read (``"flex"``: the flex capacity).

Input tokens are estimated as one per four characters of the prompt text (it
is never stored or echoed); the headers ``x-fake-input-tokens``,
``x-fake-output-tokens`` and ``x-fake-cache-read-tokens`` set them exactly
(every SDK lets a test add headers).  A ``reset`` fault raises
:class:`ConnectionResetError` out of the app: in-process the client sees it,
and the real server turns it into a dropped connection.

This module sits below :mod:`~rateloop.testing._fake.provider`: the provider
serves itself through it, and it knows the provider only as :class:`Served`,
the few members it reads.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from rateloop.testing._fake.buckets import FakeLimits, Profile
from rateloop.testing._fake.model import SERVICE_TIERS, FakeRequest, FakeResponse, FakeStats

__all__ = ["Served", "describe", "handle_httpx", "parse_request", "serve_asgi"]

_GEMINI_PATH = re.compile(r"^/v1(?:beta)?/models/([^/:]+):(generateContent|streamGenerateContent)$")
_MAX_BODY = 32 * 1024 * 1024

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class Served(Protocol):
    """What the HTTP endpoints read from a provider (a :class:`FakeProvider`)."""

    @property
    def profile(self) -> Profile: ...
    @property
    def model(self) -> str: ...
    @property
    def limits(self) -> FakeLimits: ...
    @property
    def latency(self) -> float: ...
    @property
    def rejected_spends_request(self) -> bool: ...
    @property
    def flex(self) -> FakeLimits | None: ...
    @property
    def stats(self) -> FakeStats: ...

    def reset(self) -> None: ...
    def batch_route(self, method: str, path: str, headers: Mapping[str, str],
                    body: bytes) -> tuple[int, str, bytes] | None: ...
    def respond(self, request: FakeRequest | None = None) -> FakeResponse: ...
    async def arespond(self, request: FakeRequest | None = None) -> FakeResponse: ...


def describe(provider: Served) -> dict[str, Any]:
    """The provider's configuration, for ``/fake/stats`` and the CLI banner."""
    lim = provider.limits
    return {
        "profile": provider.profile,
        "model": provider.model,
        "limits": {k: getattr(lim, k) for k in ("rpm", "tpm", "itpm", "otpm", "rpd",
                                                 "concurrency", "burst_seconds")},
        "latency": provider.latency,
        "rejected_spends_request": provider.rejected_spends_request,
        "flex": None if provider.flex is None else {
            k: getattr(provider.flex, k) for k in ("rpm", "tpm", "itpm", "otpm", "burst_seconds")},
    }


def _texts(value: Any) -> list[str]:
    """Every string inside a prompt structure (messages, system, contents, parts)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [t for k, v in value.items() if k not in ("role", "type") for t in _texts(v)]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    return []


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"header {name} must be an integer >= 0, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"header {name} must be an integer >= 0, got {raw!r}")
    return value


def parse_request(
    path: str, headers: Mapping[str, str], body: Mapping[str, Any]
) -> FakeRequest | None:
    """The :class:`FakeRequest` an HTTP request describes, or ``None`` for an unknown path."""
    profile: Profile
    stream = body.get("stream") is True
    tier: Any = None
    if path.rstrip("/") in ("/v1/chat/completions", "/chat/completions"):
        profile = "openai"
        model = str(body.get("model") or "fake-model")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 256
        prompt: Any = body.get("messages")
        tier = body.get("service_tier")
    elif path.rstrip("/") in ("/v1/messages", "/messages"):
        profile = "anthropic"
        model = str(body.get("model") or "fake-model")
        max_tokens = body.get("max_tokens") or 1024
        prompt = [body.get("system"), body.get("messages")]
    elif match := _GEMINI_PATH.match(path):
        profile = "gemini"
        model = match.group(1)
        stream = match.group(2) == "streamGenerateContent"
        config = body.get("generationConfig") or body.get("generation_config") or {}
        max_tokens = (config.get("maxOutputTokens") or config.get("max_output_tokens") or 256
                      if isinstance(config, Mapping) else 256)
        prompt = [body.get("systemInstruction"), body.get("contents")]
    else:
        return None
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
    if tier is not None and tier not in SERVICE_TIERS:
        raise ValueError(f"service_tier must be one of {', '.join(SERVICE_TIERS)}, got {tier!r}")
    estimate = math.ceil(sum(len(t) for t in _texts(prompt)) / 4)
    given = _int_header(headers, "x-fake-input-tokens")
    return FakeRequest(
        input_tokens=given if given is not None else estimate,
        max_tokens=max_tokens,
        output_tokens=_int_header(headers, "x-fake-output-tokens"),
        cache_read_tokens=_int_header(headers, "x-fake-cache-read-tokens") or 0,
        stream=stream,
        model=model,
        profile=profile,
        service_tier=tier,
    )


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            raise ValueError("request body too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send_json(send: Send, status: int, data: Any) -> None:
    body = json.dumps(data).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _send_response(send: Send, response: FakeResponse) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
    if not response.chunks:
        headers.append((b"content-length", str(len(response.content)).encode()))
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": headers})
    if not response.chunks:
        await send({"type": "http.response.body", "body": response.content})
        return
    for chunk in response.chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def handle_httpx(provider: Served, request: Any) -> Any:
    """Answer an httpx / httpx2 ``Request`` synchronously (for ``MockTransport``).

    The response is built with the request's own library, so the same
    handler serves ``httpx.MockTransport`` and ``httpx2.MockTransport``.  The
    provider's latency passes on its clock with ``sleep``; a ``reset`` fault
    raises the library's ``ReadError``.
    """
    import importlib

    library = importlib.import_module(type(request).__module__.split(".")[0])
    path = request.url.path
    if path == "/fake/stats" and request.method == "GET":
        return library.Response(200, json={**provider.stats.as_dict(),
                                           "config": describe(provider)})
    query = request.url.query.decode("latin-1")
    answer = provider.batch_route(request.method, f"{path}?{query}" if query else path,
                                  dict(request.headers), request.content)
    if answer is not None:
        status, content_type, content = answer
        return library.Response(status, headers={"content-type": content_type}, content=content)
    try:
        body = json.loads(request.content) if request.content else {}
        if not isinstance(body, Mapping):
            raise ValueError("the request body must be a JSON object")
        fake_request = (parse_request(path, dict(request.headers), body)
                        if request.method == "POST" else None)
    except ValueError as exc:
        return library.Response(400, json={"error": {"message": f"invalid request: {exc}",
                                                     "type": "invalid_request_error"}})
    if fake_request is None:
        return library.Response(404, json={"error": {
            "message": f"no fake endpoint for {request.method} {path}",
            "type": "invalid_request_error", "code": "not_found"}})
    response = provider.respond(fake_request)
    if response.reset:
        raise library.ReadError("the fake provider reset the connection (a scripted fault)",
                                request=request)
    return library.Response(response.status_code, headers=response.headers,
                            content=response.content)


async def serve_asgi(provider: Served, scope: Any, receive: Receive, send: Send) -> None:
    """Serve one ASGI HTTP request (lifespan messages are acknowledged)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        raise ValueError(f"FakeProvider serves HTTP only, got an ASGI {scope['type']!r} scope")
    path: str = scope["path"]
    method: str = scope["method"]
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    raw = await _read_body(receive)
    if path == "/fake/stats" and method == "GET":
        await _send_json(send, 200, {**provider.stats.as_dict(), "config": describe(provider)})
        return
    if path == "/fake/reset" and method == "POST":
        provider.reset()
        await _send_json(send, 200, {"reset": True})
        return
    query = scope.get("query_string", b"").decode("latin-1")
    answer = provider.batch_route(method, f"{path}?{query}" if query else path, headers, raw)
    if answer is not None:
        status, content_type, content = answer
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type.encode()),
                                (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})
        return
    try:
        body = json.loads(raw) if raw else {}
        if not isinstance(body, Mapping):
            raise ValueError("the request body must be a JSON object")
        request = parse_request(path, headers, body) if method == "POST" else None
    except ValueError as exc:
        err = {"message": f"invalid request: {exc}", "type": "invalid_request_error"}
        await _send_json(send, 400, {"error": err})
        return
    if request is None:
        err = {"message": f"no fake endpoint for {method} {path}", "type": "invalid_request_error",
               "code": "not_found"}
        await _send_json(send, 404, {"error": err})
        return
    response = await provider.arespond(request)
    if response.reset:
        raise ConnectionResetError("the fake provider reset the connection (a scripted fault)")
    await _send_response(send, response)
