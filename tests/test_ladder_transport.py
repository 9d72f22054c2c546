"""The ready clients and the transport send each attempt at its rung's service tier.

When the degrade ladder moves a call to the flex rung, the request body carries
``"service_tier": "flex"``; moved back to the standard tier it asks for
``"default"``.  The FakeProvider serves over real HTTP on a FakeClock and counts
what it received per tier (``flex_attempts``) and echoes each answer's tier.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import rateloop
from rateloop import Policy
from rateloop.integrations._request import body_at_tier
from rateloop.testing import FakeClock, FakeLimits, FakeProvider, FakeProviderServer

MESSAGES = [{"role": "user", "content": "hi"}]


def ladder(*rungs: str) -> Policy:
    """The ready clients call as interactive work.  A rung is left after one refused
    attempt, or when its wait (the learned limit's) is past the 10 s pause limit."""
    return Policy.from_dict({"ladder": {"interactive": list(rungs)}, "attempts_per_route": 1,
                             "pause_limit_secs": 10})


def test_the_flex_rung_sends_service_tier_flex_and_standard_does_not() -> None:
    clock = FakeClock()
    fake = FakeProvider(rpm=1, flex=FakeLimits(rpm=60), clock=clock)
    with FakeProviderServer(fake) as server:
        client = rateloop.openai_client(base_url=server.url + "/v1", api_key="sk-fake",
                                        timeout=10.0, policy=ladder("standard", "flex"),
                                        clock=clock)
        try:
            first = client.chat.completions.create(model="gpt-big", messages=MESSAGES,
                                                   max_tokens=5)
            assert first.service_tier == "default"  # the standard rung: the body as written
            assert (fake.stats.attempts, fake.stats.flex_attempts) == (1, 0)
            # The standard tier's one request a minute is spent: the flex rung, at once.
            second = client.chat.completions.create(model="gpt-big", messages=MESSAGES,
                                                    max_tokens=5)
        finally:
            client.close()
    assert second.service_tier == "flex"
    assert (fake.stats.attempts, fake.stats.flex_attempts, fake.stats.flex_served) == (2, 1, 1)
    assert clock.sleeps == []  # moved on at once, never waited for the standard tier


def test_a_flex_request_moved_to_standard_asks_for_default() -> None:
    clock = FakeClock()
    fake = FakeProvider(rpm=60, flex=FakeLimits(rpm=1), clock=clock)

    async def main(url: str) -> list[Any]:
        client = rateloop.async_openai_client(base_url=url + "/v1", api_key="sk-fake",
                                              timeout=10.0, policy=ladder("flex", "standard"),
                                              clock=clock)
        try:
            return [await client.chat.completions.create(
                model="gpt-big", messages=MESSAGES, max_tokens=5, service_tier="flex")
                for _ in range(2)]
        finally:
            await client.close()

    with FakeProviderServer(fake) as server:
        first, second = asyncio.run(main(server.url))
    assert first.service_tier == "flex"
    # Flex's one request a minute is spent: its refusal moves the call to standard.
    assert second.service_tier == "default"
    assert (fake.stats.attempts, fake.stats.flex_attempts, fake.stats.flex_refused) == (3, 2, 1)


@pytest.mark.parametrize(
    ("content", "provider", "tier", "expected"),
    [
        (b'{"model": "m"}', "openai", "flex", b'{"model": "m", "service_tier": "flex"}'),
        (b'{"model": "m", "service_tier": "auto"}', "openai", "flex",
         b'{"model": "m", "service_tier": "flex"}'),
        (b'{"model": "m", "service_tier": "flex"}', "openai", "standard",
         b'{"model": "m", "service_tier": "default"}'),
        (b'{"model": "m", "service_tier": "flex"}', "openai", "flex", None),
        (b'{"model": "m", "service_tier": "priority"}', "openai", "standard", None),
        (b'{"model": "m"}', "anthropic", "flex", None),
        (b"[1, 2]", "openai", "flex", None),
        (b"{not json", "openai", "flex", None),
        (b"", "openai", "flex", None),
    ],
)
def test_body_at_tier(content: bytes, provider: str, tier: str, expected: bytes | None) -> None:
    assert body_at_tier(content, provider, tier) == expected
