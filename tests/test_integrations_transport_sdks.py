"""The failure matrix through every ready client: openai, anthropic, google-genai, sync and async.

Each row scripts the provider on 127.0.0.1 and checks what the real SDK
returned or raised and how many requests the server saw (the SDK's own
retries are off: exactly the loop's attempts arrive).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from google.genai import errors as genai_errors

import rateloop
from rateloop import Limiter, LimitSpec, Policy, RecordingSink
from rateloop.integrations._request import key_fingerprint
from rateloop.integrations._transport import AdmissionRefused, admission_refusal
from rateloop.testing import FakeClock
from transport_server import ScriptedProvider, Step

MESSAGES = [{"role": "user", "content": "say hello"}]


@dataclass(frozen=True)
class Sdk:
    name: str
    is_async: bool
    make: Callable[..., Any]
    call: Callable[[Any], Any]
    model: str
    provider: str
    rate_limited: type[BaseException]
    invalid: type[BaseException]
    unreachable: tuple[type[BaseException], ...]
    key: str

    def run(self, server: ScriptedProvider, clock: FakeClock, **ours: Any) -> Any:
        """Build the client, make one call, close the client; return the call's result."""
        client = self.make(server.url, clock=clock, **ours)
        if not self.is_async:
            try:
                return self.call(client)
            finally:
                _close(client)

        async def main() -> Any:
            try:
                return await self.call(client)
            finally:
                await _aclose(client)

        return asyncio.run(main())


def _close(client: Any) -> None:
    inner = getattr(client, "_api_client", None)
    if inner is not None:  # google-genai: close the httpx clients we gave it
        inner._httpx_client.close()
        return
    client.close()


async def _aclose(client: Any) -> None:
    inner = getattr(client, "_api_client", None)
    if inner is not None:
        await inner._async_httpx_client.aclose()
        inner._httpx_client.close()
        return
    await client.close()


def _openai(url: str, *, is_async: bool, **ours: Any) -> Any:
    make = rateloop.async_openai_client if is_async else rateloop.openai_client
    return make(base_url=url + "/v1", api_key="sk-test", timeout=10.0, **ours)


def _anthropic(url: str, *, is_async: bool, **ours: Any) -> Any:
    make = rateloop.async_anthropic_client if is_async else rateloop.anthropic_client
    return make(base_url=url, api_key="sk-ant-test", timeout=10.0, **ours)


def _genai(url: str, **ours: Any) -> Any:
    return rateloop.genai_client(api_key="g-test", http_options={"base_url": url}, **ours)


def _openai_call(client: Any) -> Any:
    return client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=30)


def _anthropic_call(client: Any) -> Any:
    return client.messages.create(model="claude-x", max_tokens=30, messages=MESSAGES)


def _genai_call(client: Any) -> Any:
    return client.models.generate_content(model="gemini-2.5-flash", contents="say hello")


def _genai_acall(client: Any) -> Any:
    return client.aio.models.generate_content(model="gemini-2.5-flash", contents="say hello")


_OPENAI_NET = (openai.APIConnectionError,)
_ANTHROPIC_NET = (anthropic.APIConnectionError,)
_GENAI_NET = (httpx2.TransportError,)

SDKS = [
    Sdk("openai", False, lambda u, **o: _openai(u, is_async=False, **o), _openai_call,
        "gpt-4o-mini", "openai", openai.RateLimitError, openai.BadRequestError, _OPENAI_NET,
        "sk-test"),
    Sdk("openai-async", True, lambda u, **o: _openai(u, is_async=True, **o), _openai_call,
        "gpt-4o-mini", "openai", openai.RateLimitError, openai.BadRequestError, _OPENAI_NET,
        "sk-test"),
    Sdk("anthropic", False, lambda u, **o: _anthropic(u, is_async=False, **o), _anthropic_call,
        "claude-x", "anthropic", anthropic.RateLimitError, anthropic.BadRequestError,
        _ANTHROPIC_NET, "sk-ant-test"),
    Sdk("anthropic-async", True, lambda u, **o: _anthropic(u, is_async=True, **o),
        _anthropic_call, "claude-x", "anthropic", anthropic.RateLimitError,
        anthropic.BadRequestError, _ANTHROPIC_NET, "sk-ant-test"),
    Sdk("genai", False, _genai, _genai_call, "gemini-2.5-flash", "google",
        genai_errors.ClientError, genai_errors.ClientError, _GENAI_NET, "g-test"),
    Sdk("genai-async", True, _genai, _genai_acall, "gemini-2.5-flash", "google",
        genai_errors.ClientError, genai_errors.ClientError, _GENAI_NET, "g-test"),
]

by_sdk = pytest.mark.parametrize("sdk", SDKS, ids=[s.name for s in SDKS])


@pytest.fixture
def server() -> Iterator[ScriptedProvider]:
    with ScriptedProvider() as provider:
        yield provider


def _usage(result: Any) -> tuple[int, int]:
    usage = getattr(result, "usage", None)
    if usage is None:
        meta = result.usage_metadata
        return meta.prompt_token_count, meta.candidates_token_count
    inp = getattr(usage, "prompt_tokens", None) or usage.input_tokens
    out = getattr(usage, "completion_tokens", None) or usage.output_tokens
    return inp, out


RETRIED = [
    Step(429, {"retry-after": "4"}, {"error": {"type": "rate_limit_error", "message": "slow"}}),
    Step(529, body={"type": "error", "error": {"type": "overloaded_error"}}),
    Step(503, body={"error": {"code": 503, "status": "UNAVAILABLE", "message": "overloaded"}}),
    Step(drop=True),
    Step(200, body={"error": {"type": "overloaded_error", "message": "Overloaded"}}),
]


@by_sdk
@pytest.mark.parametrize("step", RETRIED, ids=["429", "529", "503", "dropped", "200-envelope"])
def test_a_retryable_refusal_costs_one_more_request_and_no_more(
    server: ScriptedProvider, sdk: Sdk, step: Step
) -> None:
    clock = FakeClock()
    server.add(step)
    result = sdk.run(server, clock)
    assert _usage(result) == (11, 7)
    assert server.count() == 2


@by_sdk
def test_a_bad_request_is_the_sdks_own_error_at_once(server: ScriptedProvider, sdk: Sdk) -> None:
    server.add(Step(400, body={"error": {"code": 400, "message": "bad request",
                                         "type": "invalid_request_error"}}))
    with pytest.raises(sdk.invalid):
        sdk.run(server, FakeClock())
    assert server.count() == 1


@by_sdk
def test_a_minimum_beyond_the_budget_is_returned_at_once(
    server: ScriptedProvider, sdk: Sdk
) -> None:
    clock = FakeClock()
    server.add(Step(429, {"retry-after": "1800"}, {"error": {"code": 429, "message": "slow",
                                                            "type": "rate_limit_error"}}))
    with pytest.raises(sdk.rate_limited):
        sdk.run(server, clock)
    assert server.count() == 1
    assert clock.monotonic() == 0.0


@by_sdk
def test_persistent_429s_stop_at_max_attempts(server: ScriptedProvider, sdk: Sdk) -> None:
    server.default = Step(429, body={"error": {"code": 429, "message": "slow",
                                               "type": "rate_limit_error"}})
    with pytest.raises(sdk.rate_limited):
        sdk.run(server, FakeClock(), policy=Policy(max_attempts=4))
    assert server.count() == 4


@by_sdk
def test_an_unreachable_server_is_the_sdks_connection_error(
    server: ScriptedProvider, sdk: Sdk
) -> None:
    server.default = Step(drop=True)
    with pytest.raises(sdk.unreachable):
        # Network errors have their own bound: max_attempts (the 429 budget) does not stop them.
        sdk.run(server, FakeClock(), policy=Policy(max_attempts=1, max_error_attempts=3))
    assert server.count() == 3


@by_sdk
def test_a_local_admission_refusal_is_its_own_error(server: ScriptedProvider, sdk: Sdk) -> None:
    clock = FakeClock()
    limiter = Limiter.from_url(
        "memory://", clock=clock, limits={f"{sdk.provider}:{sdk.model}": LimitSpec(
            tokens_per_minute=5, burst=1.0)}
    )
    with pytest.raises(Exception) as caught:  # which class is the SDK's choice
        sdk.run(server, clock, limiter=limiter)
    refused = admission_refusal(caught.value)
    assert isinstance(refused, AdmissionRefused)
    assert refused.outcome.status is rateloop.Status.REJECTED
    assert server.count() == 0


@by_sdk
def test_success_headers_are_observed_and_usage_settled(
    server: ScriptedProvider, sdk: Sdk
) -> None:
    clock, sink = FakeClock(), RecordingSink()
    limiter = Limiter.from_url("memory://", clock=clock)
    headers = (
        {"anthropic-ratelimit-requests-limit": "50",
         "anthropic-ratelimit-requests-remaining": "49",
         "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:01Z"}
        if sdk.provider == "anthropic"
        else {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
              "x-ratelimit-reset-requests": "1s"}
    )
    server.add(Step(200, headers))
    sdk.run(server, clock, limiter=limiter, sinks=[sink])
    scope = f"{sdk.provider}:{sdk.model}:127.0.0.1-{key_fingerprint(server.url, sdk.key)}"
    learned = limiter.limits_for(scope)
    assert learned is not None and learned.requests_per_minute is not None
    # Settlement: 100 tokens a minute; each call reserves ~40 and spends 18.
    # profile="generic": output settles to the tokens produced, whichever the provider.
    limiter.set_limits(scope, LimitSpec(tokens_per_minute=100, burst=1.0, profile="generic"))
    for _ in range(3):
        sdk.run(server, clock, limiter=limiter, sinks=[sink])
    assert "admission_wait" not in sink.decisions
    assert clock.monotonic() == 0.0

