"""The FakeProvider's flex tier: its own capacity, OpenAI's flex refusal, read by rateloop."""

from __future__ import annotations

import httpx
import openai
import pytest

from rateloop import Kind, classify_exception, classify_response
from rateloop.classify.openai import FLEX_SCOPE, FLEX_UNAVAILABLE
from rateloop.testing import FakeClock, FakeLimits, FakeProvider, FakeProviderServer, FakeRequest

FLEX = FakeRequest(service_tier="flex")
MESSAGES = [{"role": "user", "content": "hello"}]


def test_flex_has_its_own_capacity_and_refuses_with_resource_unavailable() -> None:
    clock = FakeClock()
    fake = FakeProvider(rpm=60, burst_seconds=1, flex=FakeLimits(rpm=120, burst_seconds=1),
                        clock=clock)
    # The standard tier's one slot is spent: flex still serves from its own two.
    assert [fake.respond().status_code for _ in range(2)] == [200, 429]
    answers = [fake.respond(FLEX) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    refused = answers[-1]
    assert refused.refused == "resource_unavailable"
    assert refused.json()["error"]["code"] == "resource_unavailable"
    assert refused.json()["error"]["message"].startswith("Resource Unavailable")
    assert "retry-after" not in refused.headers  # the guide names no wait
    signal = classify_response(refused, now=clock.now())
    assert (signal.kind, signal.code, signal.scope, signal.retry_after) == (
        Kind.TEMPORARY, FLEX_UNAVAILABLE, FLEX_SCOPE, None)
    stats = fake.stats
    assert (stats.flex_attempts, stats.flex_served, stats.flex_refused) == (3, 2, 1)
    assert (stats.served, stats.refusals["resource_unavailable"], stats.refusals["requests"]) == (
        3, 1, 1)


def test_a_flex_refusal_is_not_charged_a_slot() -> None:
    clock = FakeClock()
    fake = FakeProvider(flex=FakeLimits(rpm=60, burst_seconds=1), clock=clock)
    assert fake.respond(FLEX).ok
    for _ in range(5):  # hammering does not dig the flex bucket into debt
        assert fake.respond(FLEX).status_code == 429
    clock.advance(1.0)  # exactly one slot refills
    assert fake.respond(FLEX).ok


def test_answers_echo_the_tier_and_flex_is_slower() -> None:
    clock = FakeClock()
    fake = FakeProvider(latency=0.5, flex=FakeLimits(rpm=60), flex_latency=2.0, clock=clock)
    assert fake.respond().json()["service_tier"] == "default"
    assert fake.respond(FLEX).json()["service_tier"] == "flex"
    assert clock.sleeps == [0.5, 2.5]


def test_flex_on_a_provider_without_flex_is_a_400_that_reads_invalid() -> None:
    fake = FakeProvider(rpm=60, clock=FakeClock())
    answer = fake.respond(FLEX)
    assert (answer.status_code, answer.refused) == (400, "flex_unsupported")
    assert classify_response(answer).kind is Kind.INVALID
    assert (fake.stats.flex_attempts, fake.stats.flex_refused) == (1, 1)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: FakeRequest(service_tier="turbo"), "service_tier must be one of"),
        (lambda: FakeProvider(flex=FakeLimits(rpm=5, rpd=10)), "flex capacity takes rpm"),
        (lambda: FakeProvider(flex=FakeLimits(rpm=5), flex_latency=-1), "flex_latency"),
        (lambda: FakeProvider(profile="anthropic", flex=FakeLimits(rpm=5)).respond(FLEX),
         "service_tier='flex' is OpenAI's"),
    ],
)
def test_bad_flex_input_is_a_clear_error(make: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make()  # type: ignore[operator]


def test_openai_sdk_sends_flex_and_reads_the_refusal_over_http() -> None:
    fake = FakeProvider(rpm=600, flex=FakeLimits(rpm=60, burst_seconds=1), clock=FakeClock())
    with FakeProviderServer(fake) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="fake", max_retries=0,
                               timeout=10)
        ok = client.chat.completions.create(model="gpt-x", messages=MESSAGES, max_tokens=5,
                                            service_tier="flex")
        assert ok.service_tier == "flex"
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="gpt-x", messages=MESSAGES, max_tokens=5,
                                           service_tier="flex")
        standard = client.chat.completions.create(model="gpt-x", messages=MESSAGES,
                                                  max_tokens=5)
        assert standard.service_tier == "default"
        bad = httpx.post(server.url + "/v1/chat/completions", timeout=10,
                         json={"model": "gpt-x", "messages": MESSAGES, "service_tier": "turbo"})
        assert bad.status_code == 400 and "service_tier must be one of" in bad.text
    signal = classify_exception(caught.value)
    assert (signal.kind, signal.retryable, signal.code, signal.scope) == (
        Kind.TEMPORARY, True, "flex_unavailable", "tier:flex")
    assert signal.retry_after is None and signal.dimension is None
    assert (fake.stats.flex_served, fake.stats.flex_refused, fake.stats.served) == (1, 1, 2)
