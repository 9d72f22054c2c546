"""The first hour with rateloop: 50 concurrent chat calls with the real ``openai`` SDK.

A local FakeProvider server stands in for OpenAI: 1200 requests per minute with one second of
burst (20 requests at once, then 20 a second), answering 429s with OpenAI's own body and
headers.  The same 50 concurrent calls run twice:

1. with the plain SDK (its own 2 retries): some calls are lost to 429s;
2. through the RATE loop with the limit declared in a policy: admission paces the calls, so
   none is refused, and every call ends in an explicit Outcome.

Run it:  python3 examples/first_hour.py      (no network: the server runs on 127.0.0.1)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import openai

from rateloop import AsyncRateLoop, Limiter, Outcome, Policy, Route
from rateloop.integrations.sdk import plain_client
from rateloop.testing import FakeProvider, FakeProviderServer

CALLS = 50
MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "Say hello in five words."}]

# The limit the provider enforces, declared once: rateloop admits calls within it.
POLICY = Policy.from_dict(
    {
        "backoff": {"initial_delay_secs": 1, "max_delay_secs": 5},
        "limits": {f"openai:{MODEL}": {"requests_per_minute": 1200, "burst": 1 / 60}},
    }
)


async def plain_sdk(base_url: str) -> Counter[str]:
    """Fifty concurrent calls with the SDK alone (max_retries=2, its default)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="fake-key", max_retries=2)

    async def one() -> str:
        try:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        except openai.RateLimitError:
            return "lost to a 429"
        return "completed"

    results = Counter(await asyncio.gather(*(one() for _ in range(CALLS))))
    await client.close()
    return results


async def with_rateloop(base_url: str) -> list[Outcome]:
    """The same calls through the RATE loop, admitted within the declared limit."""
    # SDK retries off: the loop around each call retries.
    client = plain_client("openai", is_async=True, base_url=base_url, api_key="fake-key")
    loop = AsyncRateLoop(POLICY, limiter=Limiter.from_policy(POLICY))
    route = Route(provider="openai", model=MODEL)

    async def ask(route: Route) -> object:
        return await client.chat.completions.create(model=route.model, messages=MESSAGES)  # type: ignore[arg-type]

    outcomes = await asyncio.gather(*(loop.call(ask, route=route) for _ in range(CALLS)))
    await client.close()
    return list(outcomes)


def main() -> None:
    fake = FakeProvider(profile="openai", rpm=1200, burst_seconds=1, model=MODEL)
    with FakeProviderServer(fake) as server:
        base_url = server.url + "/v1"

        start = time.monotonic()
        plain = asyncio.run(plain_sdk(base_url))
        plain_secs = time.monotonic() - start
        plain_refused = fake.stats.refused
        print(f"plain SDK: {dict(plain)} in {plain_secs:.1f}s; the provider refused "
              f"{plain_refused} requests")

        fake.reset()  # full buckets, empty counters
        start = time.monotonic()
        outcomes = asyncio.run(with_rateloop(base_url))
        secs = time.monotonic() - start
        statuses = Counter(o.status.value for o in outcomes)
        waited = sum(o.waited_secs for o in outcomes)
        print(f"rateloop:  {dict(statuses)} in {secs:.1f}s; the provider refused "
              f"{fake.stats.refused} requests; {waited:.1f}s waited in all")
        print(f"first answer: {outcomes[0].value.choices[0].message.content!r}")

    assert statuses == {"completed": CALLS}, statuses
    assert fake.stats.served == CALLS


if __name__ == "__main__":
    main()
