"""A fleet on virtual time against the FakeProvider (shared by the refusal tests).

30 tasks × 4 calls through one ``AsyncRateLoop`` against a provider of 1,200 RPM and
1.2M TPM with a 2 s burst, answers in 0.5 s; a refused request spends its slot.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from rateloop import AsyncRateLoop, Cost, Route
from rateloop.admission import Limiter, LimitSpec
from rateloop.policy import Policy
from rateloop.testing import FakeProvider, FakeRequest


def run_fleet(
    route: Route,
    *,
    seed: int,
    limits: dict[str, LimitSpec] | None = None,
    transit: float = 0.0,
    foreign: int = 0,
) -> FakeProvider:
    """Run the fleet; the provider after it (its ``stats``).

    ``limits`` None: zero-config (learned from the headers).  ``transit``: each
    request reaches the provider 0..transit s after it is sent.  ``foreign``:
    another client takes that many request slots at t = 3 s.
    """
    from rateloop.sim.vtime import VirtualClock, run_virtual

    async def main() -> FakeProvider:
        clock = VirtualClock()
        provider = FakeProvider(profile="openai", rpm=1_200, tpm=1_200_000, burst_seconds=2,
                                latency=0.5, refusal_latency=0.01, clock=clock)
        rng = random.Random(seed)
        limiter = Limiter(limits=limits, clock=clock, rng=random.Random(seed))
        loop = AsyncRateLoop(Policy(), limiter=limiter, clock=clock, rng=rng.random)
        gate = asyncio.Semaphore(30)
        cost = Cost(input_tokens=500, output_tokens=400)

        async def attempt(_route: Route) -> Any:
            if transit:
                await asyncio.sleep(rng.uniform(0.0, transit))
            return await provider.arespond(
                FakeRequest(input_tokens=500, max_tokens=400, output_tokens=240)
            )

        async def task() -> None:
            async with gate:
                for _ in range(4):
                    assert (await loop.call(attempt, route=route, cost=cost)).ok

        async def other_client() -> None:
            await clock.asleep(3.0)
            bucket = provider._buckets["requests"]
            bucket.refill(clock.monotonic())
            bucket.take(foreign)

        await asyncio.gather(*(task() for _ in range(30)), *([other_client()] if foreign else []))
        return provider

    return run_virtual(main())
