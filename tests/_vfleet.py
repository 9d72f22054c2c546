"""A fleet on virtual time against the FakeProvider (shared by the refusal and burst tests).

30 tasks × 4 calls through one ``AsyncRateLoop`` against a provider of 1,200 RPM and
1.2M TPM with a 2 s burst, answers in 0.5 s; a refused request spends its slot.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from rateloop import AsyncRateLoop, Cost, Route
from rateloop.admission import Limiter, LimitSpec
from rateloop.policy import Policy
from rateloop.testing import FakeProvider, FakeRequest


@dataclass(frozen=True)
class Call:
    """One call of the fleet: what it sends and what it is answered."""

    input_tokens: int = 500
    max_tokens: int = 400
    output_tokens: int = 240


@dataclass
class FleetRun:
    provider: FakeProvider
    limiter: Limiter
    seconds: float  # virtual seconds until the last task finished
    starts: list[float]  # when each attempt reached the provider (virtual seconds)


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
    return run_fleet_timed(route, seed=seed, limits=limits, transit=transit,
                           foreign=foreign).provider


def run_fleet_timed(
    route: Route,
    *,
    seed: int,
    limits: dict[str, LimitSpec] | None = None,
    transit: float = 0.0,
    foreign: int = 0,
    call: Call = Call(),
    tasks: int = 30,
    calls: int = 4,
    provider_options: dict[str, Any] | None = None,
    limiter_options: dict[str, Any] | None = None,
) -> FleetRun:
    """:func:`run_fleet` with its time, the limiter, and the fleet's shape as arguments.

    ``provider_options`` replace the provider's (``profile``, ``rpm``, ``tpm``,
    ``itpm``, ``otpm``, ``burst_seconds``, ...); ``limiter_options`` go to the
    :class:`Limiter` (``cold_start``, ...).
    """
    from rateloop.sim.vtime import VirtualClock, run_virtual

    async def main() -> FleetRun:
        clock = VirtualClock()
        options: dict[str, Any] = {"profile": "openai", "rpm": 1_200, "tpm": 1_200_000,
                                   "burst_seconds": 2, "latency": 0.5, "refusal_latency": 0.01}
        provider = FakeProvider(**{**options, **(provider_options or {})}, clock=clock)
        rng = random.Random(seed)
        limiter = Limiter(limits=limits, clock=clock, rng=random.Random(seed),
                          **(limiter_options or {}))
        starts: list[float] = []
        loop = AsyncRateLoop(Policy(), limiter=limiter, clock=clock, rng=rng.random)
        gate = asyncio.Semaphore(30)
        start = clock.monotonic()
        cost = Cost(input_tokens=call.input_tokens, output_tokens=call.max_tokens)
        request = FakeRequest(input_tokens=call.input_tokens, max_tokens=call.max_tokens,
                              output_tokens=call.output_tokens)

        async def attempt(_route: Route) -> Any:
            if transit:
                await asyncio.sleep(rng.uniform(0.0, transit))
            starts.append(clock.monotonic() - start)
            return await provider.arespond(request)

        async def task() -> None:
            async with gate:
                for _ in range(calls):
                    assert (await loop.call(attempt, route=route, cost=cost)).ok

        async def other_client() -> None:
            await clock.asleep(3.0)
            bucket = provider._buckets["requests"]
            bucket.refill(clock.monotonic())
            bucket.take(foreign)

        await asyncio.gather(*(task() for _ in range(tasks)),
                             *([other_client()] if foreign else []))
        return FleetRun(provider, limiter, clock.monotonic() - start, starts)

    return run_virtual(main())
