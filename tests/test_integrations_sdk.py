"""SDK retry ownership, end to end against a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rateloop.errors import SdkRetriesWarning
from rateloop.integrations.sdk import plain_client
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.loop.sdk_count import sdk_retries_taken
from rateloop.outcome import Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.testing import FakeClock

openai = pytest.importorskip("openai")

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
THROTTLE = {"error": {"message": "Rate limit reached", "type": "requests",
                      "code": "rate_limit_exceeded", "param": None}}


class Provider:
    """A scripted OpenAI-compatible endpoint: each request takes the next (status, body)."""

    def __init__(self, script: list[tuple[int, dict[str, Any], dict[str, str]]]) -> None:
        self.script = script
        self.retry_counts: list[str | None] = []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                provider.retry_counts.append(self.headers.get("x-stainless-retry-count"))
                status, body, headers = provider.script[
                    min(len(provider.retry_counts) - 1, len(provider.script) - 1)
                ]
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> Provider:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def throttled_twice() -> Iterator[Provider]:
    script = [
        (429, THROTTLE, {"retry-after-ms": "1"}),
        (429, THROTTLE, {"retry-after-ms": "1"}),
        (200, COMPLETION, {}),
    ]
    with Provider(script) as provider:
        yield provider


ROUTE = Route(provider="openai", model="gpt-test")


def ask(client: Any) -> Any:
    def fn(route: Route) -> Any:
        return client.chat.completions.create(
            model=route.model, messages=[{"role": "user", "content": "hi"}]
        )

    return fn


def test_helpers_turn_sdk_retries_off() -> None:
    assert plain_client("openai", api_key="sk-test").max_retries == 0
    assert plain_client("openai", api_key="sk-test", max_retries=3).max_retries == 3
    pytest.importorskip("anthropic")
    assert plain_client("anthropic", api_key="sk-ant-test").max_retries == 0


def test_rateloop_owns_the_retries(throttled_twice: Provider) -> None:
    clock = FakeClock()
    client = plain_client("openai", api_key="sk-test", base_url=throttled_twice.url)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), clock=clock)
    out = loop.call(ask(client), route=ROUTE)
    assert out.status is Status.COMPLETED
    assert out.value.choices[0].message.content == "hello"
    assert (out.attempts.loop, out.attempts.sdk) == (3, 0)
    assert out.attempts.provider_requests == len(throttled_twice.retry_counts) == 3
    assert len(clock.sleeps) == 2


def test_sdk_retries_left_on_are_counted(throttled_twice: Provider) -> None:
    clock = FakeClock()
    client = openai.OpenAI(api_key="sk-test", base_url=throttled_twice.url, max_retries=1)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), clock=clock)
    with pytest.warns(SdkRetriesWarning, match="max_retries=0"):
        out = loop.call(ask(client), route=ROUTE)
    assert out.status is Status.COMPLETED
    # Attempt 1: two requests (the SDK retried once), both 429. Attempt 2: one request, 200.
    assert out.attempts.loop == 2
    assert out.attempts.sdk == 1
    assert out.attempts.provider_requests == len(throttled_twice.retry_counts) == 3


def test_sdk_retries_taken_reads_raw_responses_and_errors() -> None:
    class Raw:
        retries_taken = 4

    assert sdk_retries_taken(Raw()) == 4
    assert sdk_retries_taken(object()) == 0


def test_sdk_retries_inside_a_successful_attempt_are_counted() -> None:
    script = [(429, THROTTLE, {"retry-after-ms": "1"}), (200, COMPLETION, {})]
    with Provider(script) as provider:
        client = plain_client("openai", api_key="sk-test", base_url=provider.url, max_retries=1)
        with pytest.warns(SdkRetriesWarning):
            out = RateLoop(Policy(), clock=FakeClock()).call(ask(client), route=ROUTE)
        assert out.status is Status.COMPLETED
        assert (out.attempts.loop, out.attempts.sdk) == (1, 1)
        assert out.attempts.provider_requests == len(provider.retry_counts) == 2


def test_async_client_requests_are_counted_too() -> None:
    import asyncio


    script = [(429, THROTTLE, {"retry-after-ms": "1"}), (200, COMPLETION, {})]
    with Provider(script) as provider:
        client = plain_client(
            "openai", is_async=True, api_key="sk-test", base_url=provider.url, max_retries=1
        )

        async def fn(route: Route) -> Any:
            return await client.chat.completions.create(
                model=route.model, messages=[{"role": "user", "content": "hi"}]
            )

        with pytest.warns(SdkRetriesWarning):
            out = asyncio.run(AsyncRateLoop(Policy(), clock=FakeClock()).call(fn, route=ROUTE))
        assert out.status is Status.COMPLETED
        assert out.attempts.provider_requests == len(provider.retry_counts) == 2


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_the_retry_budget_counts_the_requests_the_provider_saw(twin: str) -> None:
    """max_attempts = 6 with a plain SDK client that keeps its own 2 retries: 6 requests."""
    import asyncio

    script = [(429, THROTTLE, {"retry-after-ms": "1"})]
    policy = Policy.from_dict({"max_attempts": 6, "backoff": {"jitter": "none"}})
    with Provider(script) as provider:
        if twin == "sync":
            client = openai.OpenAI(api_key="sk-test", base_url=provider.url, max_retries=2)
            loop = RateLoop(policy, clock=FakeClock())
            with pytest.warns(SdkRetriesWarning) as warned:
                out = loop.call(ask(client), route=ROUTE)
                loop.call(ask(client), route=ROUTE)  # the warning is given once per loop
        else:
            aclient = openai.AsyncOpenAI(api_key="sk-test", base_url=provider.url, max_retries=2)

            async def fn(route: Route) -> Any:
                return await aclient.chat.completions.create(
                    model=route.model, messages=[{"role": "user", "content": "hi"}]
                )

            aloop = AsyncRateLoop(policy, clock=FakeClock())

            async def twice() -> Any:
                first = await aloop.call(fn, route=ROUTE)
                await aloop.call(fn, route=ROUTE)
                return first

            with pytest.warns(SdkRetriesWarning) as warned:
                out = asyncio.run(twice())
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    # Two loop attempts of three requests each (1 + 2 SDK retries): the provider saw 6, not 18.
    assert (out.attempts.loop, out.attempts.sdk) == (2, 4)
    assert out.attempts.provider_requests == 6
    assert len(provider.retry_counts) == 12  # two calls of 6 requests
    assert len([w for w in warned if w.category is SdkRetriesWarning]) == 1
    assert isinstance(out.error, openai.RateLimitError)
