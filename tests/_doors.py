"""The six doors into the RATE loop, each driven as a new user would, zero-config.

A door is a function ``door(url) -> Run`` that builds the user's program the
way the docs show (no limits, no policy, no limiter) and makes ``CALLS``
concurrent chat calls through it against a :class:`FakeProviderServer` on
127.0.0.1.  :func:`measure` runs one door against a fresh provider and
returns what the provider and the caller saw.

    PYTHONPATH=src:tests python3 tests/_doors.py            # the table, every door
    PYTHONPATH=src:tests python3 tests/_doors.py langchain  # one door
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rateloop.testing import FakeProvider, FakeProviderServer

CALLS = 50
#: 10 requests a second with one second of burst: 10 may go at once, then one every 100 ms.
RPM = 600
BURST_SECONDS = 1.0
LATENCY = 0.05
MODEL = "gpt-4o-mini"
MESSAGES = [{"role": "user", "content": "Summarise the plot of Hamlet in one line."}]
BODY = {"model": MODEL, "messages": MESSAGES, "max_tokens": 20}


@dataclass(frozen=True)
class Result:
    door: str
    completed: int
    lost: int
    refused: int
    attempts: int
    wall_s: float
    errors: tuple[str, ...]

    @property
    def refusals_per_success(self) -> float:
        return self.refused / self.completed if self.completed else float("inf")

    def row(self) -> str:
        return (
            f"{self.door:<22} lost {self.lost:>2}/{CALLS}  refusals/success "
            f"{self.refusals_per_success:6.3f}  requests {self.attempts:>3}  "
            f"wall {self.wall_s:5.1f}s  {', '.join(self.errors)}"
        )


def _threads(call: Callable[[], Any]) -> list[BaseException | None]:
    def one(_: int) -> BaseException | None:
        try:
            call()
        except Exception as exc:
            return exc
        return None

    with ThreadPoolExecutor(max_workers=CALLS) as pool:
        return list(pool.map(one, range(CALLS)))


def _tasks(call: Callable[[], Any]) -> list[BaseException | None]:
    async def main() -> list[BaseException | None]:
        results = await asyncio.gather(*(call() for _ in range(CALLS)), return_exceptions=True)
        return [r if isinstance(r, BaseException) else None for r in results]

    return asyncio.run(main())


# --- the doors ---------------------------------------------------------------------------


def ready_client(url: str) -> list[BaseException | None]:
    import rateloop

    client = rateloop.openai_client(base_url=url + "/v1", api_key="sk-fake")
    try:
        return _threads(lambda: client.chat.completions.create(**BODY))
    finally:
        client.close()


def rateloop_transport(url: str) -> list[BaseException | None]:
    import openai

    from rateloop.integrations.clients import rateloop_transport as build

    http = openai.DefaultHttpxClient(transport=build(is_async=False))
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-fake", http_client=http)
    try:
        return _threads(lambda: client.chat.completions.create(**BODY))
    finally:
        client.close()


def _direct(module: str) -> Callable[[str], list[BaseException | None]]:
    def door(url: str) -> list[BaseException | None]:
        import importlib

        hx = importlib.import_module(module)
        faces = importlib.import_module(f"rateloop.integrations.{module}")
        http = hx.Client(transport=faces.RateLoopTransport(), base_url=url)

        def call() -> None:
            answer = http.post(
                "/v1/chat/completions", json=BODY, headers={"authorization": "Bearer sk-fake"}
            )
            answer.raise_for_status()

        try:
            return _threads(call)
        finally:
            http.close()

    door.__name__ = f"transport_{module}"
    return door


def langchain(
    url: str, *, limiter: Any = None, **model_options: Any
) -> list[BaseException | None]:
    from langchain_fake import SdkChatModel
    from rateloop import Route
    from rateloop.integrations.langchain import RateLoopRateLimiter

    route = Route(provider="openai", model=MODEL)
    rate_limiter = (
        RateLoopRateLimiter(route=route)
        if limiter is None
        else RateLoopRateLimiter(limiter, route=route)
    )
    model = SdkChatModel(
        base_url=url + "/v1",
        rate_limiter=rate_limiter,
        callbacks=[rate_limiter.usage_callback()],
        **model_options,
    )
    try:
        return _threads(lambda: model.invoke("Summarise the plot of Hamlet in one line."))
    finally:
        model.close()


def langchain_defaults(url: str) -> list[BaseException | None]:
    """The LangChain door with ChatOpenAI's own defaults: no response headers, 2 SDK retries."""
    return langchain(url, include_response_headers=False, max_retries=2)


def langchain_no_headers(url: str) -> list[BaseException | None]:
    """The LangChain door without response headers and without SDK retries."""
    return langchain(url, include_response_headers=False, max_retries=0)


def langchain_limiter(url: str) -> list[BaseException | None]:
    """The LangChain door as main documented it: the user's own ``Limiter()``."""
    from rateloop import Limiter

    return langchain(url, limiter=Limiter())


def pydantic_ai(url: str) -> list[BaseException | None]:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel

    from rateloop.integrations.pydantic_ai import openai_provider

    async def go() -> list[BaseException | None]:
        provider = openai_provider(base_url=url + "/v1", api_key="sk-fake")
        agent = Agent(OpenAIChatModel(MODEL, provider=provider))
        try:
            results = await asyncio.gather(
                *(agent.run("Summarise Hamlet.") for _ in range(CALLS)), return_exceptions=True
            )
        finally:
            await provider.client.close()
        return [r if isinstance(r, BaseException) else None for r in results]

    return asyncio.run(go())


def openai_agents(url: str) -> list[BaseException | None]:
    import agents
    from agents import Agent, OpenAIChatCompletionsModel, Runner

    from rateloop.integrations.openai_agents import use_rateloop_client

    agents.set_tracing_disabled(True)

    async def go() -> list[BaseException | None]:
        client = use_rateloop_client(base_url=url + "/v1", api_key="sk-fake")
        agent = Agent(name="assistant", model=OpenAIChatCompletionsModel(MODEL, client))
        try:
            results = await asyncio.gather(
                *(Runner.run(agent, "Summarise Hamlet.") for _ in range(CALLS)),
                return_exceptions=True,
            )
        finally:
            await client.close()
        return [r if isinstance(r, BaseException) else None for r in results]

    return asyncio.run(go())


DOORS: dict[str, Callable[[str], list[BaseException | None]]] = {
    "ready_client": ready_client,
    "rateloop_transport": rateloop_transport,
    "transport_httpx": _direct("httpx"),
    "transport_httpx2": _direct("httpx2"),
    "langchain": langchain,
    "langchain_limiter": langchain_limiter,
    "pydantic_ai": pydantic_ai,
    "openai_agents": openai_agents,
}


#: The LangChain door with a model that reports no response headers (ChatOpenAI's default):
#: nothing to learn from an answer, so calls go one at a time until a refusal teaches.
HEADERLESS = {
    "langchain_defaults": langchain_defaults,
    "langchain_no_headers": langchain_no_headers,
}


def measure(name: str) -> Result:
    provider = FakeProvider(
        profile="openai", rpm=RPM, burst_seconds=BURST_SECONDS, latency=LATENCY, model=MODEL
    )
    with FakeProviderServer(provider) as server:
        start = time.monotonic()
        outcomes = (DOORS | HEADERLESS)[name](server.url)
        wall = time.monotonic() - start
        stats = provider.stats
    errors = [e for e in outcomes if e is not None]
    return Result(
        door=name,
        completed=len(outcomes) - len(errors),
        lost=len(errors),
        refused=stats.refused,
        attempts=stats.attempts,
        wall_s=round(wall, 2),
        errors=tuple(sorted({type(e).__name__ for e in errors})),
    )


if __name__ == "__main__":
    for door in sys.argv[1:] or [*DOORS, *HEADERLESS]:
        try:
            print(measure(door).row(), flush=True)
        except Exception as exc:  # a door that cannot even be built on this code
            print(f"{door:<22} cannot run: {type(exc).__name__}: {exc}", flush=True)
