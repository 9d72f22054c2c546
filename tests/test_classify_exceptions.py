"""classify_exception / classify_response with the real SDK exception classes."""

from __future__ import annotations

import errno
import socket
from datetime import UTC, datetime
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from rateloop.classify import classify_exception, classify_response
from rateloop.signal import CONNECT_FAILED, Dimension, Kind

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OPENAI_URL = "https://api.openai.com/v1/chat/completions"
ANTHROPIC_URL = "https://api.anthropic.com/v1/messages"


def _response(
    status: int, body: Any, headers: dict[str, str] | None = None, url: str = OPENAI_URL
) -> httpx2.Response:
    return httpx2.Response(
        status, headers=headers or {}, json=body, request=httpx2.Request("POST", url)
    )


def test_openai_insufficient_quota_is_spend() -> None:
    body = {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    response = _response(429, body, {"x-request-id": "req_q"})
    exc = openai.RateLimitError("quota", response=response, body=body["error"])
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.retryable, signal.provider, signal.request_id) == (
        Kind.SPEND, False, "openai", "req_q"
    )


def test_openai_rate_limit_is_temporary_with_the_server_wait() -> None:
    body = {"error": {"message": "Rate limit reached for gpt-4o on tokens per min (TPM): "
                      "Limit 30000. Please try again in 1.2s.", "type": "tokens",
                      "code": "rate_limit_exceeded"}}
    response = _response(429, body, {"retry-after-ms": "1500"})
    exc = openai.RateLimitError("rl", response=response, body=body["error"])
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.retry_after, signal.dimension) == (
        Kind.TEMPORARY, 1.5, Dimension.TOKENS
    )


def test_openai_engine_overloaded_is_overload() -> None:
    body = {"error": {"message": "The engine is currently overloaded, please try again later",
                      "type": "server_error", "code": None}}
    exc = openai.InternalServerError("503", response=_response(503, body), body=body["error"])
    assert classify_exception(exc, now=NOW).kind is Kind.OVERLOAD


def test_openai_authentication_is_permission() -> None:
    body = {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                      "code": "invalid_api_key"}}
    exc = openai.AuthenticationError("401", response=_response(401, body), body=body["error"])
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.retryable) == (Kind.PERMISSION, False)


@pytest.mark.parametrize(
    "exc",
    [
        openai.APITimeoutError(request=httpx2.Request("POST", OPENAI_URL)),
        openai.APIConnectionError(request=httpx2.Request("POST", OPENAI_URL)),
        anthropic.APIConnectionError(request=httpx2.Request("POST", ANTHROPIC_URL)),
        anthropic.APITimeoutError(request=httpx2.Request("POST", ANTHROPIC_URL)),
    ],
    ids=["openai-timeout", "openai-connection", "anthropic-connection", "anthropic-timeout"],
)
def test_sdk_connection_errors_are_network(exc: BaseException) -> None:
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.retryable, signal.matched) == (
        Kind.NETWORK, True, type(exc).__name__
    )


def test_anthropic_rate_limit() -> None:
    body = {"type": "error", "error": {"type": "rate_limit_error", "message":
            "This request would exceed the rate limit for your organization of 50 requests "
            "per minute."}, "request_id": "req_011"}
    response = _response(429, body, {"retry-after": "17", "request-id": "req_011"}, ANTHROPIC_URL)
    exc = anthropic.RateLimitError("rl", response=response, body=body)
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.retry_after, signal.dimension, signal.request_id) == (
        Kind.TEMPORARY, 17.0, Dimension.REQUESTS, "req_011"
    )
    assert signal.provider == "anthropic"


def test_anthropic_overloaded_529() -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    exc = anthropic.OverloadedError(
        "Overloaded", response=_response(529, body, url=ANTHROPIC_URL), body=body
    )
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.code, signal.status) == (Kind.OVERLOAD, "overloaded_error", 529)


def test_anthropic_credit_balance_is_spend() -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message":
            "Your credit balance is too low to access the Anthropic API."}}
    exc = anthropic.BadRequestError(
        "400", response=_response(400, body, url=ANTHROPIC_URL), body=body
    )
    assert classify_exception(exc, now=NOW).kind is Kind.SPEND


def test_sdk_error_with_an_httpx_response_is_classified_too() -> None:
    body = {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}
    response = httpx.Response(
        429, headers={"retry-after": "4"}, json=body, request=httpx.Request("POST", OPENAI_URL)
    )
    exc = openai.RateLimitError("rl", response=response, body=body["error"])  # type: ignore[arg-type]
    assert classify_exception(exc, now=NOW).retry_after == 4.0


@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_http_status_error_classifies_its_response(lib: Any) -> None:
    request = lib.Request("GET", "https://api.github.com/repos/x/y")
    response = lib.Response(
        403,
        headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1767225660",
                 "x-github-request-id": "AB:CD"},
        json={"message": "API rate limit exceeded for user ID 1."},
        request=request,
    )
    exc = lib.HTTPStatusError("403", request=request, response=response)
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.retry_after, signal.provider) == (Kind.TEMPORARY, 60.0, "github")


@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
@pytest.mark.parametrize(
    "name", ["ConnectError", "ReadTimeout", "ConnectTimeout", "PoolTimeout",
             "RemoteProtocolError", "ReadError", "WriteError"]
)
def test_httpx_transport_errors_are_network(lib: Any, name: str) -> None:
    exc = getattr(lib, name)("boom")
    assert classify_exception(exc, now=NOW).kind is Kind.NETWORK


@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_httpx_local_protocol_error_is_not_network(lib: Any) -> None:
    signal = classify_exception(lib.LocalProtocolError("bad header"), now=NOW)
    assert (signal.kind, signal.retryable) == (Kind.UNKNOWN, False)


def test_google_genai_errors() -> None:
    errors = pytest.importorskip("google.genai.errors")
    body = {"error": {"code": 429, "message": "You exceeded your current quota.",
                      "status": "RESOURCE_EXHAUSTED", "details": [
                          {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                           "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel"}]},
                          {"@type": "type.googleapis.com/google.rpc.RetryInfo",
                           "retryDelay": "35s"}]}}
    signal = classify_exception(errors.ClientError(429, body), now=NOW)
    assert (signal.kind, signal.provider, signal.dimension) == (
        Kind.PERIOD_QUOTA, "google", Dimension.REQUESTS_PER_DAY
    )
    minute = {"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).",
                        "status": "RESOURCE_EXHAUSTED"}}
    assert classify_exception(errors.ClientError(429, minute), now=NOW).kind is Kind.TEMPORARY
    overloaded = {"error": {"code": 503, "message": "The model is overloaded. Please try again "
                            "later.", "status": "UNAVAILABLE"}}
    signal = classify_exception(errors.ServerError(503, overloaded), now=NOW)
    assert (signal.kind, signal.retryable) == (Kind.OVERLOAD, True)
    denied = {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}}
    assert classify_exception(errors.ClientError(403, denied), now=NOW).kind is Kind.PERMISSION


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("timed out"),
        ConnectionResetError(errno.ECONNRESET, "reset"),
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        socket.gaierror(socket.EAI_NONAME, "name unknown"),
        OSError(errno.ENETUNREACH, "unreachable"),
        BrokenPipeError(errno.EPIPE, "pipe"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_stdlib_network_errors(exc: BaseException) -> None:
    assert classify_exception(exc, now=NOW).kind is Kind.NETWORK


@pytest.mark.parametrize(
    "exc",
    [ValueError("x"), KeyError("k"), FileNotFoundError(errno.ENOENT, "nope"), RuntimeError()],
    ids=lambda e: type(e).__name__,
)
def test_anything_else_is_unknown_and_final(exc: BaseException) -> None:
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.retryable, signal.matched) == (
        Kind.UNKNOWN, False, type(exc).__name__
    )


def test_the_cause_chain_is_followed() -> None:
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        assert classify_exception(outer, now=NOW).kind is Kind.NETWORK


def test_classify_response_reads_httpx_and_observes_200s() -> None:
    response = httpx.Response(
        200,
        headers={"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
                 "x-ratelimit-reset-requests": "1s", "openai-organization": "org"},
        json={"id": "chatcmpl-1"},
    )
    signal = classify_response(response, now=NOW)
    assert (signal.kind, signal.provider) == (Kind.OK, "openai")
    assert [(o.dimension, o.limit, o.remaining, o.reset_after) for o in signal.observed] == [
        (Dimension.REQUESTS, 60.0, 59.0, 1.0)
    ]


def test_classify_response_on_httpx2_429() -> None:
    signal = classify_response(_response(429, {"error": {"message": "Too many requests"}},
                                         {"retry-after": "2"}), now=NOW)
    assert (signal.kind, signal.retry_after) == (Kind.TEMPORARY, 2.0)


def test_classify_response_skips_an_unread_stream() -> None:
    def chunks() -> Any:
        yield b'{"error": {"type": "overloaded_error"}}'

    response = httpx.Response(529, content=chunks())
    assert classify_response(response, now=NOW).kind is Kind.OVERLOAD


def test_classify_response_needs_a_status() -> None:
    with pytest.raises(TypeError, match="status_code"):
        classify_response(object())


def test_classify_exception_needs_an_exception() -> None:
    with pytest.raises(TypeError, match="needs an exception"):
        classify_exception("boom")  # type: ignore[arg-type]


def test_requests_response_and_unread_stream() -> None:
    requests = pytest.importorskip("requests")
    response = requests.Response()
    response.status_code = 429
    response.headers.update({"Retry-After": "9"})
    response._content = b'{"error": {"message": "You exceeded your current quota"}}'
    assert classify_response(response, now=NOW).kind is Kind.SPEND
    streaming = requests.Response()
    streaming.status_code = 429
    streaming.headers.update({"Retry-After": "9"})
    streaming.raw = None  # never read: the body is skipped, the headers still count
    signal = classify_response(streaming, now=NOW)
    assert (signal.kind, signal.retry_after) == (Kind.TEMPORARY, 9.0)
    error = requests.HTTPError("429", response=response)
    assert classify_exception(error, now=NOW).kind is Kind.SPEND
    assert classify_exception(requests.ConnectionError("reset"), now=NOW).kind is Kind.NETWORK


def _caused(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(httpx.ConnectError("[Errno 111] Connection refused"), CONNECT_FAILED,
                     id="httpx-connect"),
        pytest.param(httpx2.ConnectError("[Errno -2] Name or service not known"), CONNECT_FAILED,
                     id="httpx2-connect-dns"),
        pytest.param(
            _caused(openai.APIConnectionError(request=httpx2.Request("POST", OPENAI_URL)),
                    httpx2.ConnectError("refused")),
            CONNECT_FAILED, id="openai-wrapping-connect",
        ),
        pytest.param(
            _caused(anthropic.APIConnectionError(request=httpx2.Request("POST", ANTHROPIC_URL)),
                    httpx2.ConnectError("refused")),
            CONNECT_FAILED, id="anthropic-wrapping-connect",
        ),
        pytest.param(ConnectionRefusedError(errno.ECONNREFUSED, "refused"), CONNECT_FAILED,
                     id="stdlib-refused"),
        pytest.param(socket.gaierror(socket.EAI_NONAME, "name unknown"), CONNECT_FAILED,
                     id="stdlib-dns"),
        pytest.param(OSError(errno.EHOSTUNREACH, "no route"), CONNECT_FAILED, id="unreachable"),
        # Opened, then lost or slow: the request may have been sent.  Not a refusal.
        pytest.param(httpx.ReadError("reset"), None, id="read-error"),
        pytest.param(httpx2.RemoteProtocolError("closed"), None, id="dropped"),
        pytest.param(httpx.ConnectTimeout("slow"), None, id="connect-timeout"),
        pytest.param(httpx.PoolTimeout("pool"), None, id="pool-timeout"),
        pytest.param(ConnectionResetError(errno.ECONNRESET, "reset"), None, id="reset"),
        pytest.param(
            _caused(openai.APIConnectionError(request=httpx2.Request("POST", OPENAI_URL)),
                    httpx2.ReadError("reset")),
            None, id="openai-wrapping-read",
        ),
    ],
)
def test_a_connection_that_never_opened_is_marked(exc: BaseException, code: str | None) -> None:
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.code) == (Kind.NETWORK, code)
