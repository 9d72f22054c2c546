"""The LangChain adapter through LangChain's own chat model class (langchain-core)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from rateloop import Cost, Limiter, LimitSpec, Route
from rateloop.integrations.langchain import RateLoopRateLimiter
from rateloop.testing import FakeClock

# Anthropic corrects output to the tokens produced (OpenAI keeps max_tokens): settling refunds.
ROUTE = Route(provider="anthropic", model="claude-haiku-4-5", project="p1")


def _answers(n: int, used: int = 10) -> GenericFakeChatModel:
    usage = {"input_tokens": used // 2, "output_tokens": used - used // 2, "total_tokens": used}
    return GenericFakeChatModel(
        messages=iter([AIMessage(content="hello", usage_metadata=usage) for _ in range(n)])
    )


def _rate_limiter(clock: FakeClock, tokens_per_minute: int, cost: Cost) -> RateLoopRateLimiter:
    """LangChain's limiter reserving ``cost`` on ``ROUTE``, over an in-memory token limit."""
    limiter = Limiter.from_url(
        "memory://", clock=clock,
        limits={ROUTE.scope: LimitSpec(tokens_per_minute=tokens_per_minute, burst=1.0)},
    )
    return RateLoopRateLimiter(limiter, route=ROUTE, cost=cost)


def test_the_model_acquires_before_each_call_and_settles_after_it() -> None:
    # 100 tokens a minute, 50 reserved per call, 10 really used: settled, four calls
    # and one more reservation fit; unsettled, the third call would wait.
    clock = FakeClock()
    limiter = _rate_limiter(clock, 100, Cost(input_tokens=20, output_tokens=30))
    model = _answers(4)
    model.rate_limiter = limiter
    for _ in range(4):
        reply = model.invoke("hi", config={"callbacks": [limiter.usage_callback()]})
        assert reply.content == "hello"
    assert limiter.open_reservations == 0
    assert clock.monotonic() == 0.0  # no call had to wait for capacity
    assert limiter.acquire(blocking=False) is True


def test_without_the_usage_callback_the_estimate_holds_the_capacity() -> None:
    clock = FakeClock()
    limiter = _rate_limiter(clock, 100, Cost(input_tokens=20, output_tokens=40))
    model = _answers(1)
    model.rate_limiter = limiter
    model.invoke("hi")
    assert limiter.open_reservations == 1
    assert limiter.acquire(blocking=False) is False  # 60 reserved + 60 more > 100


def test_a_blocking_acquire_waits_for_capacity_on_the_clock() -> None:
    clock = FakeClock()
    limiter = _rate_limiter(clock, 60, Cost(input_tokens=30, output_tokens=30))
    assert limiter.acquire() is True
    assert limiter.acquire() is True  # waited (virtually) for the bucket to refill
    assert clock.monotonic() > 0


def test_the_async_model_path_settles_too() -> None:
    clock = FakeClock()
    limiter = _rate_limiter(clock, 100, Cost(input_tokens=20, output_tokens=40))
    model = _answers(4)
    model.rate_limiter = limiter

    async def main() -> None:
        for _ in range(4):
            await model.ainvoke("hi", config={"callbacks": [limiter.usage_callback()]})

    asyncio.run(main())
    assert limiter.open_reservations == 0
    assert clock.monotonic() == 0.0


def test_a_route_is_required() -> None:
    with pytest.raises(TypeError, match=r"route must be a rateloop\.Route"):
        RateLoopRateLimiter(Limiter.from_url("memory://"), route="openai:gpt")  # type: ignore[arg-type]
