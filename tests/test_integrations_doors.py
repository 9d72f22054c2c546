"""Every door into the RATE loop, zero-config, against a 10 req/s provider on 127.0.0.1.

One builder (``rateloop.integrations._assemble``) assembles the loop for the
ready clients, ``rateloop_transport()``, a transport built directly and the
framework adapters, so 50 concurrent calls through any door end the same:
none lost, (almost) no 429s.  The doors and the measurement are in
``tests/_doors.py`` (run it as a script for the table); the HTTP is real.
"""

from __future__ import annotations

import asyncio
import warnings

import httpx2
import openai
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

import rateloop
from _doors import CALLS, DOORS, measure
from langchain_fake import SdkChatModel
from rateloop import Limiter, LimitSpec, Policy, RateLoop, Route
from rateloop.errors import LimitsWarning
from rateloop.integrations._assemble import SDK_RETRIES, admission
from rateloop.integrations.clients import rateloop_transport
from rateloop.integrations.httpx2 import AsyncRateLoopTransport, RateLoopTransport
from rateloop.integrations.langchain import RateLoopRateLimiter
from rateloop.integrations.sdk import plain_client
from rateloop.testing import FakeClock, FakeProvider, FakeProviderServer

# Every door a user meets; "langchain_limiter" is LangChain over the user's own Limiter().
DOOR_NAMES = sorted(DOORS)


@pytest.mark.slow
@pytest.mark.parametrize("door", DOOR_NAMES)
def test_fifty_concurrent_calls_through_every_door_lose_nothing(door: str) -> None:
    result = measure(door)
    assert (result.lost, result.completed) == (0, CALLS), result.row()
    assert result.refusals_per_success <= 0.05, result.row()


@pytest.mark.slow
def test_langchain_without_response_headers_goes_one_at_a_time_until_a_refusal_teaches() -> None:
    # ChatOpenAI's own defaults (no headers, 2 SDK retries): nothing is lost.
    with pytest.warns(LimitsWarning, match="one at a time"):
        defaults = measure("langchain_defaults")
    assert (defaults.lost, defaults.completed) == (0, CALLS), defaults.row()
    # No headers and no SDK retries: only the probes a 429 refused before it taught are lost
    # (all but 11 of 50 were, when the first header-less answer opened the gate).
    with pytest.warns(LimitsWarning, match="one at a time"):
        blind = measure("langchain_no_headers")
    assert blind.lost <= 3 and blind.refusals_per_success <= 0.1, blind.row()


# --- one builder, the same defaults --------------------------------------------------------


def test_every_transport_door_gets_the_self_learning_limiter() -> None:
    transports = [
        RateLoopTransport(),
        AsyncRateLoopTransport(),
        rateloop_transport(is_async=False),
        rateloop_transport(is_async=True, package="httpx"),
    ]
    for transport in transports:
        assert isinstance(transport.limiter, Limiter), transport
        assert dict(transport.limiter.limits) == {}  # nothing configured: it learns
    client = rateloop.openai_client(api_key="sk-fake")
    try:
        assert client.max_retries == SDK_RETRIES == 0
    finally:
        client.close()
    assert plain_client("openai", api_key="sk-fake").max_retries == SDK_RETRIES


def test_a_limiter_loop_or_policy_the_user_passes_is_theirs() -> None:
    limiter = Limiter.from_url("memory://")
    policy = Policy(max_attempts=3)
    assert RateLoopTransport(limiter=limiter, policy=policy).limiter is limiter
    assert RateLoopTransport(policy=policy).policy.max_attempts == 3
    assert rateloop_transport(is_async=False, limiter=limiter).limiter is limiter
    loop = RateLoop(policy, limiter=limiter)
    assert RateLoopTransport(loop=loop).limiter is limiter
    route = Route(provider="openai", model="m")
    assert RateLoopRateLimiter(limiter, route=route).limiter is limiter
    assert admission(limiter=limiter).limiter is limiter
    configured = Policy.from_dict({"limits": {"openai:m": {"requests_per_minute": 60}}})
    learned = RateLoopRateLimiter(route=route, policy=configured).limiter
    assert learned.limits_for("openai:m") is not None


def test_the_ready_client_refuses_what_would_undo_the_loop() -> None:
    with pytest.raises(TypeError, match="max_retries= is set by the rateloop client helpers"):
        rateloop.openai_client(api_key="sk-fake", max_retries=2)
    with pytest.raises(TypeError, match="http_client= is set"):
        rateloop.anthropic_client(api_key="sk-fake", http_client=httpx2.Client())


def test_plain_client_names_the_sdks_it_builds() -> None:
    with pytest.raises(ValueError, match="sdk must be 'openai' or 'anthropic'"):
        plain_client("gemini")  # type: ignore[arg-type]


# --- LangChain: the adapter that cannot run the loop around the call still learns ----------


def test_langchain_learns_from_a_refusal_and_pauses_the_scope() -> None:
    # Two calls at once on a one-request burst: the second's 429 pauses the scope (the
    # server's minimum), so the next acquire waits instead of spending another refusal.
    clock = FakeClock()
    fake = FakeProvider(profile="openai", rpm=60, burst_seconds=1.0, model="gpt-4o-mini")
    with FakeProviderServer(fake) as server:
        route = Route(provider="openai", model="gpt-4o-mini")
        rate_limiter = RateLoopRateLimiter(route=route, clock=clock)
        model = SdkChatModel(
            base_url=server.url + "/v1",
            rate_limiter=rate_limiter,
            callbacks=[rate_limiter.usage_callback()],
            include_response_headers=False,
        )
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model.invoke("one")  # the probe: no headers, nothing learned
            assert [w.category for w in caught] == [LimitsWarning]
            assert "no rate-limit headers" in str(caught[0].message)
            with pytest.raises(openai.RateLimitError):
                model.invoke("two")
        finally:
            model.close()
    assert fake.stats.refused == 1
    assert rate_limiter.open_reservations == 0
    # The refusal taught the limit (its headers) and paused the scope: no capacity now.
    assert rate_limiter.limiter.limits_for(route.provider_scope) is not None
    assert rate_limiter.acquire(blocking=False) is False


def test_langchain_first_contact_holds_the_others_until_the_probe_answers() -> None:
    fake = FakeProvider(profile="openai", rpm=60, burst_seconds=1.0, model="gpt-4o-mini")
    with FakeProviderServer(fake) as server:
        route = Route(provider="openai", model="gpt-4o-mini")
        rate_limiter = RateLoopRateLimiter(route=route)
        model = SdkChatModel(
            base_url=server.url + "/v1",
            rate_limiter=rate_limiter,
            callbacks=[rate_limiter.usage_callback()],
        )

        async def main() -> list[object]:
            return list(
                await asyncio.gather(*(model.ainvoke("hi") for _ in range(3)))
            )

        try:
            replies = asyncio.run(main())
        finally:
            model.close()
    assert len(replies) == 3
    assert fake.stats.refused == 0  # the probe taught 60 rpm; the others were paced


def test_langchain_with_configured_limits_never_probes() -> None:
    route = Route(provider="openai", model="gpt-4o-mini")
    limiter = Limiter.from_url("memory://", limits={route.scope: LimitSpec(concurrency=8)})
    rate_limiter = RateLoopRateLimiter(limiter, route=route)
    rate_limiter.usage_callback()
    assert all(rate_limiter.acquire(blocking=False) for _ in range(3))
