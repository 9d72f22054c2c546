"""Classify what a call raised or returned, without importing any SDK.

How it works: exceptions are recognised by duck typing and by the names of
the classes in their MRO, so no SDK is imported here — a module that is not
installed is simply never seen.  In order:

1. google-genai ``APIError`` (``.code`` int, ``.details`` JSON, module
   ``google.genai``) → :func:`classify` with provider ``google``.
2. botocore ``ClientError`` (``.response`` dict with ``Error`` and
   ``ResponseMetadata``) → classified as an HTTP response (Bedrock).
3. Anything carrying an HTTP-like ``.response`` (``status_code`` + ``headers``):
   openai / anthropic ``APIStatusError``, httpx / httpx2 ``HTTPStatusError``,
   requests ``HTTPError`` → :func:`classify_response`, preferring the body the
   SDK already decoded (``.body``).
4. Transport failures — httpx / httpx2 ``TimeoutException`` and
   ``TransportError`` (but not ``LocalProtocolError`` / ``UnsupportedProtocol``,
   which are our bugs), openai / anthropic ``APIConnectionError`` and
   ``APITimeoutError``, requests / urllib3 / aiohttp connection errors, and the
   standard library's ``TimeoutError``, ``ConnectionError``, ``socket.gaierror``
   and socket ``OSError`` errnos → ``network``.  When the exception or a cause
   of it says the connection never opened (httpx ``ConnectError``, urllib3
   ``NewConnectionError``, aiohttp ``ClientConnectorError``, a refused
   connection, an unknown host, no route), the signal's ``code`` is
   :data:`~rateloop.signal.CONNECT_FAILED`: nothing was sent.  A connect
   *timeout* is not marked (a slow host may yet answer).
5. Else the exception's ``__cause__`` / ``__context__`` chain is tried; else
   ``unknown`` (not retryable).
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from rateloop.classify._core import classify, classify_hinted, resolve_now
from rateloop.classify._far import far_wait_threshold
from rateloop.classify.tools import with_request
from rateloop.signal import CONNECT_FAILED, Kind, LimitSignal

__all__ = ["classify_exception", "classify_response"]

_NETWORK_NAMES = frozenset(
    {
        "TimeoutException", "TransportError", "NetworkError", "ConnectError", "ReadError",
        "WriteError", "CloseError", "RemoteProtocolError", "ProxyError", "PoolTimeout",
        "ConnectTimeout", "ReadTimeout", "WriteTimeout", "APIConnectionError",
        "APITimeoutError", "ProtocolError", "NewConnectionError", "MaxRetryError",
        "ChunkedEncodingError", "ServerDisconnectedError", "ClientConnectionError",
        "ClientOSError", "ClientPayloadError", "ServerTimeoutError", "EndpointConnectionError",
        "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    }
)
_NOT_NETWORK_NAMES = frozenset({"LocalProtocolError", "UnsupportedProtocol", "InvalidURL"})
_NETWORK_MODULES = (
    "httpx", "httpx2", "httpcore", "openai", "anthropic", "requests", "urllib3", "aiohttp",
    "botocore", "google", "websockets",
)
_NETWORK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNRESET", "ECONNREFUSED", "ECONNABORTED", "ETIMEDOUT", "EHOSTUNREACH",
        "ENETUNREACH", "ENETDOWN", "ENETRESET", "EPIPE", "EHOSTDOWN", "ENOTCONN", "ESHUTDOWN",
    )
    if hasattr(errno, name)
)
# A connection that never opened: the class names of the HTTP libraries, and the errnos.
_CONNECT_NAMES = frozenset(
    {"ConnectError", "NewConnectionError", "ClientConnectorError", "EndpointConnectionError"}
)
_CONNECT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH")
    if hasattr(errno, name)
)
_PROVIDER_BY_MODULE = (
    ("openai", "openai"),
    ("anthropic", "anthropic"),
    ("google.genai", "google"),
    ("google.api_core", "google"),
    ("botocore", "bedrock"),
)
_MAX_CHAIN = 8


def _attr(obj: object, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # properties of half-built SDK objects can raise
        return None


def _status(resp: object) -> int | None:
    for name in ("status_code", "status"):
        value = _attr(resp, name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _headers(resp: object) -> Any:
    headers = _attr(resp, "headers")
    if isinstance(headers, Mapping):
        return headers
    if isinstance(headers, list | tuple):
        return headers
    return None


def _body(resp: object) -> str | bytes | Mapping[str, Any] | None:
    if _attr(resp, "_content") is False:  # a requests stream not read yet: never read it here
        return None
    for name in ("content", "text", "body", "data"):
        value = _attr(resp, name)
        if isinstance(value, bytes | bytearray | str) and value:
            return bytes(value) if isinstance(value, bytearray) else value
        if isinstance(value, Mapping):
            return value
    return None


def _answered(signal: LimitSignal, resp: object) -> LimitSignal:
    """A tool's signal with the request the response answered (method and URL)."""
    request = _attr(resp, "request")
    if request is None:
        return signal
    try:
        return with_request(signal, _attr(request, "method"), _attr(request, "url"))
    except Exception:  # a hostile request object must not cost the signal
        return signal


def _module_provider(obj: object) -> str | None:
    module = type(obj).__module__ or ""
    for prefix, provider in _PROVIDER_BY_MODULE:
        if module == prefix or module.startswith(prefix + "."):
            return provider
    return None


def _classify_parts(
    status: int | None,
    headers: Any,
    body: str | bytes | Mapping[str, Any] | None,
    *,
    hint: str | None,
    now: datetime,
    limit: float,
) -> LimitSignal:
    return classify_hinted(
        status, headers, body, provider=None, hint=hint, now=now, pause_limit=limit
    )


def classify_response(
    resp: object, *, now: datetime | None = None, pause_limit: float | None = None
) -> LimitSignal:
    """Classify an HTTP-like response object (``status_code``, ``headers``, a body).

    Works with httpx / httpx2 and requests responses, and anything shaped like
    them (``status`` is accepted for ``status_code``; the body is read from
    ``content``, ``text``, ``body`` or ``data``).  An unread streaming body is
    skipped rather than read.  ``pause_limit`` is the far-wait threshold, as for
    :func:`~rateloop.classify.classify`.
    """
    moment = resolve_now(now)
    limit = far_wait_threshold(pause_limit)
    status = _status(resp)
    if status is None:
        raise TypeError(
            f"classify_response needs an object with an int status_code, got {type(resp).__name__}"
        )
    signal = _classify_parts(
        status, _headers(resp), _body(resp), hint=None, now=moment, limit=limit
    )
    return _answered(signal, resp)


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _google(exc: BaseException, now: datetime, limit: float) -> LimitSignal | None:
    module = type(exc).__module__ or ""
    code = _attr(exc, "code")
    if not module.startswith("google.") or not isinstance(code, int) or isinstance(code, bool):
        return None
    details = _attr(exc, "details")
    body: Any = details if isinstance(details, Mapping | list) else None
    if isinstance(body, list):
        body = body[0] if body and isinstance(body[0], Mapping) else None
    if body is None:
        body = {"error": {"code": code, "status": _attr(exc, "status"),
                          "message": _attr(exc, "message")}}
    response = _attr(exc, "response")
    headers = _headers(response) if response is not None else None
    return classify(code, headers, body, provider="google", now=now, pause_limit=limit)


def _botocore(exc: BaseException, now: datetime, limit: float) -> LimitSignal | None:
    response = _attr(exc, "response")
    if not isinstance(response, Mapping) or not isinstance(response.get("Error"), Mapping):
        return None
    error = response["Error"]
    meta = response.get("ResponseMetadata")
    meta = meta if isinstance(meta, Mapping) else {}
    status = meta.get("HTTPStatusCode")
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    headers = meta.get("HTTPHeaders") if isinstance(meta.get("HTTPHeaders"), Mapping) else {}
    body = {"__type": str(error.get("Code", "")), "message": str(error.get("Message", ""))}
    if status is None:
        status = 400
    provider = _module_provider(exc) or "bedrock"
    return classify(status, headers, body, provider=provider, now=now, pause_limit=limit)


def _http_error(exc: BaseException, now: datetime, limit: float) -> LimitSignal | None:
    response = _attr(exc, "response")
    if response is None:
        return None
    status = _status(response)
    if status is None:
        return None
    sdk_body = _attr(exc, "body")
    body = sdk_body if isinstance(sdk_body, Mapping) else _body(response)
    if body is None and isinstance(_attr(exc, "message"), str):
        body = _attr(exc, "message")
    signal = _classify_parts(
        status, _headers(response), body, hint=_module_provider(exc), now=now, limit=limit
    )
    return _answered(signal, response)


def _errno(exc: OSError) -> int | None:
    """``exc.errno`` when it is an int: anyone may set it to anything (a list
    made ``errno in frozenset`` raise ``TypeError``)."""
    value = _attr(exc, "errno")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _transport_failure(exc: BaseException) -> LimitSignal | None:
    """A ``network`` signal when ``exc`` is a transport failure: no response arrived."""
    names = _names(exc)
    module = type(exc).__module__ or ""
    name = type(exc).__name__
    if names & _NOT_NETWORK_NAMES:
        return None
    if names & _NETWORK_NAMES and module.split(".")[0] in _NETWORK_MODULES:
        return LimitSignal.of(Kind.NETWORK, matched=name, provider=_module_provider(exc))
    if isinstance(exc, TimeoutError | ConnectionError):
        return LimitSignal.of(Kind.NETWORK, matched=name)
    # socket and ssl (~6 ms) are not imported for this check: an exception of
    # theirs can only exist once its module is loaded, so look only if it is.
    if "socket" in sys.modules:
        import socket

        if isinstance(exc, socket.gaierror | socket.herror):
            return LimitSignal.of(Kind.NETWORK, matched=name)
    if "ssl" in sys.modules:
        import ssl

        if isinstance(exc, ssl.SSLCertVerificationError):
            return None
        if isinstance(exc, ssl.SSLError):
            return LimitSignal.of(Kind.NETWORK, matched=name)
    if isinstance(exc, OSError) and _errno(exc) in _NETWORK_ERRNOS:
        return LimitSignal.of(Kind.NETWORK, matched=name)
    if module.split(".")[0] == "requests" and "RequestException" in names:
        return LimitSignal.of(Kind.NETWORK, matched=name)
    return None


def _never_opened(exc: BaseException) -> bool:
    """True when ``exc`` or a cause of it says the connection never opened."""
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(current))
        if _names(current) & _CONNECT_NAMES or isinstance(current, ConnectionRefusedError):
            return True
        if isinstance(current, OSError) and _errno(current) in _CONNECT_ERRNOS:
            return True
        if "socket" in sys.modules:
            import socket

            if isinstance(current, socket.gaierror):
                return True
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return False


def _network(exc: BaseException) -> LimitSignal | None:
    signal = _transport_failure(exc)
    if signal is None or not _never_opened(exc):
        return signal
    return replace(signal, code=CONNECT_FAILED)


def _one(exc: BaseException, now: datetime, limit: float) -> LimitSignal | None:
    for reader in (_google, _botocore, _http_error):
        try:
            signal = reader(exc, now, limit)
        except Exception:  # a half-built SDK object must not hide the network check
            signal = None
        if signal is not None:
            return signal
    try:
        return _network(exc)
    except Exception:  # a hostile exception object must not raise out of the reader
        return None


def classify_exception(
    exc: BaseException, *, now: datetime | None = None, pause_limit: float | None = None
) -> LimitSignal:
    """Classify an exception raised by a provider call; ``unknown`` when unrecognised.

    See the module docstring for what is recognised.  ``unknown`` is not
    retryable: an unrecognised exception is more likely our bug than the
    provider's weather.
    """
    if not isinstance(exc, BaseException):
        raise TypeError(f"classify_exception needs an exception, got {type(exc).__name__}")
    moment = resolve_now(now)
    limit = far_wait_threshold(pause_limit)
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(current))
        signal = _one(current, moment, limit)
        if signal is not None:
            return signal
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return LimitSignal.of(Kind.UNKNOWN, matched=type(exc).__name__)
