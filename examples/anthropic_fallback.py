"""An overloaded Claude model, a fallback that answers: the real ``anthropic`` SDK and rateloop.

Two local FakeProvider servers stand in for Anthropic: the primary model answers every request
with Anthropic's own 529 ``overloaded_error``; the backup model answers normally.  Twenty
concurrent calls go through the RATE loop with one attempt per route: each is refused once by
the primary, waits the backoff, falls back and completes ``degraded`` — and says so.  A
ConsoleSink prints what a person at a terminal would see: a handful of lines, not one per event.

Run it:  python3 examples/anthropic_fallback.py      (no network: the servers run on 127.0.0.1)
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

from rateloop import AsyncRateLoop, Outcome, Policy, Route
from rateloop.integrations.sdk import plain_client
from rateloop.outcome import ConsoleSink
from rateloop.testing import FakeProvider, FakeProviderServer, FaultScript

CALLS = 20
PRIMARY = Route(provider="anthropic", model="claude-sonnet-4-6")
BACKUP = Route(provider="anthropic", model="claude-haiku-4-5")
POLICY = Policy.from_dict(
    {"attempts_per_route": 1, "backoff": {"initial_delay_secs": 1, "max_delay_secs": 2}}
)


async def run(urls: dict[str, str]) -> list[Outcome]:
    clients = {model: plain_client("anthropic", is_async=True, base_url=url, api_key="fake-key")
               for model, url in urls.items()}
    console = ConsoleSink(sys.stdout)
    loop = AsyncRateLoop(POLICY, sinks=[console])

    async def ask(route: Route) -> str:
        message = await clients[route.model].messages.create(
            model=route.model,
            max_tokens=64,
            messages=[{"role": "user", "content": "Say hello in five words."}],
        )
        return f"{route.model}: {message.content[0].text}"  # type: ignore[union-attr]

    outcomes = await asyncio.gather(
        *(loop.call(ask, route=PRIMARY, fallbacks=[BACKUP]) for _ in range(CALLS))
    )
    for client in clients.values():
        await client.close()
    console.flush()  # the closing summary line
    return list(outcomes)


def main() -> None:
    overloaded = FakeProvider(profile="anthropic", model=PRIMARY.model,
                              faults=FaultScript(["overload"]))
    healthy = FakeProvider(profile="anthropic", model=BACKUP.model)
    with FakeProviderServer(overloaded) as primary, FakeProviderServer(healthy) as backup:
        outcomes = asyncio.run(run({PRIMARY.model: primary.url, BACKUP.model: backup.url}))
    statuses = Counter(o.status.value for o in outcomes)
    print(f"outcomes: {dict(statuses)}")
    print(f"reason:   {outcomes[0].reason}")
    print(f"answer:   {outcomes[0].value}")
    print(f"the primary refused {overloaded.stats.refusals['overload']} requests "
          f"(last error: {type(outcomes[0].error).__name__}); the backup served "
          f"{healthy.stats.served}")
    assert statuses == {"degraded": CALLS}, statuses
    assert healthy.stats.served == CALLS


if __name__ == "__main__":
    main()
