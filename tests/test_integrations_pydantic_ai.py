"""The pydantic-ai adapter through pydantic-ai's own Agent, model and concurrency classes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.models.concurrency import ConcurrencyLimitedModel
from pydantic_ai.models.openai import OpenAIChatModel

from rateloop import Cost, Limiter, LimitSpec, Reservation, Route
from rateloop.integrations.pydantic_ai import RateLoopConcurrencyLimiter, openai_provider
from rateloop.testing import FakeClock
from transport_server import ScriptedProvider, Step

POOL = Route(provider="openai", model="pool")


@pytest.fixture
def server() -> Iterator[ScriptedProvider]:
    with ScriptedProvider() as provider:
        yield provider


def test_an_agent_on_the_ready_provider_recovers_from_a_429_with_one_more_request(
    server: ScriptedProvider,
) -> None:
    clock = FakeClock()
    server.add(Step(429, {"retry-after": "3"}, {"error": {"type": "rate_limit_error"}}))
    provider = openai_provider(base_url=server.url + "/v1", api_key="sk-test", clock=clock)
    agent = Agent(OpenAIChatModel("gpt-4o-mini", provider=provider))

    async def main() -> str:
        try:
            result = await agent.run("say hello")
            return str(result.output)
        finally:
            await provider.client.close()

    assert asyncio.run(main()) == "hello"
    assert server.count() == 2
    assert clock.monotonic() >= 3


def test_concurrency_limited_model_shares_a_rateloop_lease_pool(
    server: ScriptedProvider,
) -> None:
    # Real clock: the limiter polls a held lease every 50 ms while the server answers slowly.
    server.default = Step(200, stall=0.15)
    limiter = Limiter.from_url("memory://", limits={POOL.scope: LimitSpec(concurrency=1)})
    pool = RateLoopConcurrencyLimiter(limiter, route=POOL)
    provider = openai_provider(base_url=server.url + "/v1", api_key="sk-test")
    model = ConcurrencyLimitedModel(OpenAIChatModel("gpt-4o-mini", provider=provider), pool)
    agent = Agent(model)

    async def main() -> list[str]:
        try:
            results = await asyncio.gather(*(agent.run(f"call {i}") for i in range(3)))
            return [str(r.output) for r in results]
        finally:
            await provider.client.close()

    assert asyncio.run(main()) == ["hello"] * 3
    assert server.count() == 3
    assert server.max_in_flight == 1
    assert pool.held == 0
    assert isinstance(limiter.try_reserve(POOL, Cost()), Reservation)  # the lease came back


def test_release_without_acquire_is_harmless() -> None:
    pool = RateLoopConcurrencyLimiter(Limiter.from_url("memory://"), route=POOL)
    pool.release()
    assert pool.held == 0


@pytest.mark.redis
def test_two_processes_share_one_pool_through_redis(redis_url: str, redis_prefix: str) -> None:
    # Two limiters on their own Redis connections stand for two processes.
    limits = {POOL.scope: LimitSpec(concurrency=1)}
    first = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    second = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    here = RateLoopConcurrencyLimiter(first, route=POOL)
    there = RateLoopConcurrencyLimiter(second, route=POOL)

    async def main() -> None:
        try:
            await here.acquire("model:gpt-4o-mini")
            assert not isinstance(await second.atry_reserve(POOL, Cost()), Reservation)
            here.release()  # pydantic-ai releases synchronously, from any task
            await there.acquire("model:gpt-4o-mini")
            assert there.held == 1
            there.release()
        finally:
            await first.aclose()
            await second.aclose()

    try:
        asyncio.run(main())
    finally:
        first.close()
        second.close()
