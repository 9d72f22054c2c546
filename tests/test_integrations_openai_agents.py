"""The OpenAI Agents SDK adapter through the SDK's own Agent, Runner and retry settings."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("agents")

import agents
import openai
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner
from agents.models import _openai_shared
from agents.run_internal import model_retry

from rateloop import Policy
from rateloop.integrations.openai_agents import retry_settings, use_rateloop_client
from rateloop.testing import FakeClock
from transport_server import ScriptedProvider, Step

RATE_LIMITED = {"error": {"type": "rate_limit_error", "message": "slow down"}}
FAST = Policy(max_attempts=4)


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The runner's waits between its retries, recorded instead of slept."""
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr(model_retry, "_sleep_for_retry", record)
    return delays


@pytest.fixture(autouse=True)
def _isolated_agents_sdk() -> Iterator[None]:
    agents.set_tracing_disabled(True)  # no exporter calling out of the machine
    saved = _openai_shared.get_default_openai_client()
    try:
        yield
    finally:
        _openai_shared._default_openai_client = saved


@pytest.fixture
def server() -> Iterator[ScriptedProvider]:
    with ScriptedProvider() as provider:
        yield provider


def _retrying_agent(client: Any) -> Agent[Any]:
    """An agent whose model retries as ``retry_settings(FAST)`` tells the Agents SDK to."""
    return Agent(
        name="a",
        model=OpenAIChatCompletionsModel("gpt-4o-mini", client),
        model_settings=ModelSettings(retry=retry_settings(FAST)),
    )


def _run(agent: Agent[Any], client: Any) -> str:
    async def main() -> str:
        try:
            result = await Runner.run(agent, "say hello")
            return str(result.final_output)
        finally:
            await client.close()

    return asyncio.run(main())


def test_the_default_client_runs_every_model_call_through_the_loop(
    server: ScriptedProvider,
) -> None:
    clock = FakeClock()
    server.add(Step(429, {"retry-after": "2"}, RATE_LIMITED))
    client = use_rateloop_client(base_url=server.url + "/v1", api_key="sk-test", clock=clock)
    assert _openai_shared.get_default_openai_client() is client
    agent = Agent(name="a", model=OpenAIChatCompletionsModel("gpt-4o-mini", client))
    assert _run(agent, client) == "hello"
    assert server.count() == 2
    assert clock.monotonic() >= 2


def test_the_retry_policy_retries_a_plain_client_as_the_loop_would(
    server: ScriptedProvider, slept: list[float]
) -> None:
    server.add(Step(503, body={"error": {"message": "unavailable"}}),
               Step(429, {"retry-after": "30"}, RATE_LIMITED))
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
    agent = _retrying_agent(client)
    assert _run(agent, client) == "hello"
    assert server.count() == 3
    # 503: the backoff's first step (5 s, equal jitter); 429: the server's 30 s as a floor.
    assert len(slept) == 2
    assert 2.5 <= slept[0] <= 5
    assert 30 <= slept[1] <= 30 + 5


def test_the_retry_policy_does_not_retry_an_invalid_request(
    server: ScriptedProvider, slept: list[float]
) -> None:
    server.add(Step(400, body={"error": {"message": "bad request"}}))
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-test", max_retries=0)
    agent = _retrying_agent(client)
    with pytest.raises(openai.BadRequestError):
        _run(agent, client)
    assert server.count() == 1
    assert slept == []


def test_the_retry_policy_never_stacks_on_the_transports_retries(
    server: ScriptedProvider, slept: list[float]
) -> None:
    server.default = Step(429, body=RATE_LIMITED)
    client = use_rateloop_client(
        base_url=server.url + "/v1", api_key="sk-test", clock=FakeClock(),
        policy=Policy(max_attempts=2),
    )
    agent = _retrying_agent(client)
    with pytest.raises(openai.RateLimitError):
        _run(agent, client)
    assert server.count() == 2  # the transport's two attempts; the runner added none
    assert slept == []
