"""The SDK boundary of the ready clients, against real servers on loopback.

- ``client.with_options(max_retries=N)`` keeps the loop in charge: the copy's
  SDK retries stay off, the loop's budget decides, and a warning says so.
- A connection that never opened, to a host that has not answered in this
  process, fails fast with the original error; one that has answered is retried.
- An unreachable Redis is ``BackendUnreachable`` through every SDK.

The providers are the real :class:`~rateloop.testing.FakeProvider` over real
HTTP; the "closed port" is a port bound and closed again, so connecting to
it is refused by the kernel.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
import openai
import pytest

import rateloop
from rateloop import Limiter, Policy
from rateloop.admission.backends import BackendUnreachable
from rateloop.errors import SdkRetriesWarning
from rateloop.testing import FakeClock, FakeProvider, FakeProviderServer

MESSAGES = [{"role": "user", "content": "say hello"}]


@dataclass(frozen=True)
class Door:
    """One ready client: how to build it, call it and close it."""

    name: str
    is_async: bool
    build: Callable[..., Any]
    call: Callable[[Any], Any]
    path: str  # appended to the server's URL for base_url
    sdk: Any  # the SDK module

    def client(self, url: str, **ours: Any) -> Any:
        return self.build(base_url=url + self.path, api_key="sk-test", timeout=10.0, **ours)

    def run(self, client: Any, *others: Any) -> Any:
        """Make one call with ``client``, then close it and ``others`` (on the same event loop)."""
        if not self.is_async:
            try:
                return self.call(client)
            finally:
                for each in (client, *others):
                    each.close()

        async def main() -> Any:
            try:
                return await self.call(client)
            finally:
                for each in (client, *others):
                    await each.close()

        return asyncio.run(main())

    def close(self, client: Any) -> None:
        if self.is_async:
            asyncio.run(client.close())
        else:
            client.close()


def _openai_call(client: Any) -> Any:
    return client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=5)


def _anthropic_call(client: Any) -> Any:
    return client.messages.create(model="claude-x", messages=MESSAGES, max_tokens=5)


DOORS = [
    Door("openai", False, rateloop.openai_client, _openai_call, "/v1", openai),
    Door("openai-async", True, rateloop.async_openai_client, _openai_call, "/v1", openai),
    Door("anthropic", False, rateloop.anthropic_client, _anthropic_call, "", anthropic),
    Door("anthropic-async", True, rateloop.async_anthropic_client, _anthropic_call, "",
         anthropic),
]
by_door = pytest.mark.parametrize("door", DOORS, ids=[d.name for d in DOORS])


@pytest.fixture
def failing() -> Iterator[tuple[FakeProvider, str]]:
    """A provider that answers every request with a 5xx (a retryable server error)."""
    fake = FakeProvider(fault_rates={"server_error": 1.0})
    with FakeProviderServer(fake) as server:
        yield fake, server.url


# --- item 8: with_options(max_retries=N) ----------------------------------------------


@by_door
def test_with_options_max_retries_keeps_the_loop_in_charge(
    door: Door, failing: tuple[FakeProvider, str]
) -> None:
    fake, url = failing
    client = door.client(url, clock=FakeClock(), policy=Policy(max_error_attempts=2))
    with pytest.warns(SdkRetriesWarning, match=r"max_retries=3") as warned:
        copy = client.with_options(max_retries=3)
    assert len(warned) == 1
    assert "max_error_attempts" in str(warned[0].message)
    assert copy.max_retries == 0
    with pytest.raises(door.sdk.InternalServerError):
        door.run(copy, client)
    # The loop's budget alone: 2 attempts, no SDK retry on top of either.
    assert fake.stats.attempts == 2


@by_door
def test_a_copy_of_a_copy_is_guarded_too(door: Door, failing: tuple[FakeProvider, str]) -> None:
    fake, url = failing
    client = door.client(url, clock=FakeClock(), policy=Policy(max_error_attempts=2))
    copy = client.with_options(timeout=5.0)  # no retries asked for: no warning
    assert copy.max_retries == 0
    with pytest.warns(SdkRetriesWarning, match=r"max_retries=5"):
        again = copy.copy(max_retries=5)
    assert again.max_retries == 0
    with pytest.raises(door.sdk.InternalServerError):
        door.run(again, copy, client)
    assert fake.stats.attempts == 2


@by_door
def test_with_options_max_retries_zero_is_quiet(
    door: Door, failing: tuple[FakeProvider, str]
) -> None:
    _, url = failing
    client = door.client(url, clock=FakeClock())
    assert client.with_options(max_retries=0).max_retries == 0  # filterwarnings=error
    door.close(client)


@by_door
def test_with_options_http_client_is_refused(door: Door, failing: tuple[FakeProvider, str]) -> None:
    _, url = failing
    client = door.client(url, clock=FakeClock())
    other = httpx2.AsyncClient() if door.is_async else httpx2.Client()
    with pytest.raises(TypeError, match=r"http_client= .*rateloop_transport\(\)"):
        client.with_options(http_client=other)
    if door.is_async:
        asyncio.run(other.aclose())
    else:
        other.close()
    door.close(client)


def test_the_ready_client_is_still_the_sdks_class() -> None:
    client = rateloop.openai_client(api_key="sk-test")
    assert isinstance(client, openai.OpenAI)
    assert type(client).__name__ == "OpenAI"
    client.close()
    other = rateloop.async_anthropic_client(api_key="k")
    assert isinstance(other, anthropic.AsyncAnthropic)
    asyncio.run(other.close())


# --- helpers for items 9 and 10 ----------------------------------------------------------


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then closed (connecting is refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def timed(fn: Callable[[], Any]) -> tuple[float, BaseException | None]:
    start = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        return time.monotonic() - start, exc
    return time.monotonic() - start, None


# --- item 10: an unreachable Redis ------------------------------------------------------


@by_door
def test_an_unreachable_redis_is_backend_unreachable_through_every_sdk(door: Door) -> None:
    port = closed_port()
    with FakeProviderServer(FakeProvider()) as server:
        limiter = Limiter.from_url(f"redis://:hunter2@127.0.0.1:{port}/0")
        client = door.client(server.url, limiter=limiter)
        with pytest.raises(BackendUnreachable) as caught:
            door.run(client)
        assert server.provider.stats.attempts == 0
    message = str(caught.value)
    assert f"redis://:***@127.0.0.1:{port}/0" in message and "hunter2" not in message
    assert "redis-server" in message and "on_unreachable='local'" in message
    # The Redis client's own error is kept as the cause.
    assert type(caught.value.__cause__).__module__.startswith("redis")


# --- item 9: a connection that never opened ---------------------------------------------


def _chain(error: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


@by_door
def test_a_refused_connection_to_a_host_never_answered_fails_fast(door: Door) -> None:
    clock = FakeClock()
    client = door.client(f"http://127.0.0.1:{closed_port()}", clock=clock)
    with pytest.raises(door.sdk.APIConnectionError) as caught:
        door.run(client)
    # The original error is kept: the SDK's connection error, from the refused connect.
    refused = [e for e in _chain(caught.value) if isinstance(e, httpx2.ConnectError)]
    assert refused, _chain(caught.value)
    outcome = refused[0].rateloop_outcome  # type: ignore[attr-defined]
    assert outcome.attempts.loop == 1
    assert "has not answered in this process" in outcome.reason
    assert clock.sleeps == []  # no backoff was even planned


def test_a_refused_connection_fails_within_two_seconds_on_the_real_clock() -> None:
    client = rateloop.openai_client(
        base_url=f"http://127.0.0.1:{closed_port()}/v1", api_key="sk-test"
    )
    elapsed, error = timed(lambda: _openai_call(client))
    client.close()
    assert isinstance(error, openai.APIConnectionError)
    assert elapsed < 2.0


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_the_transport_raises_the_original_connect_error_at_once(is_async: bool) -> None:
    from rateloop.integrations.httpx2 import AsyncRateLoopTransport, RateLoopTransport

    clock = FakeClock()
    url = f"http://127.0.0.1:{closed_port()}/v1/chat/completions"
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}

    async def send_async() -> Any:
        async with httpx2.AsyncClient(transport=AsyncRateLoopTransport(clock=clock)) as http:
            return await http.post(url, json=body)

    def send() -> Any:
        if is_async:
            return asyncio.run(send_async())
        with httpx2.Client(transport=RateLoopTransport(clock=clock)) as http:
            return http.post(url, json=body)

    elapsed, error = timed(send)
    assert isinstance(error, httpx2.ConnectError)
    assert error.rateloop_outcome.attempts.loop == 1  # type: ignore[attr-defined]
    assert clock.sleeps == [] and elapsed < 2.0


@by_door
def test_a_host_that_answered_before_is_retried_when_it_refuses(door: Door) -> None:
    clock = FakeClock()
    server = FakeProviderServer(FakeProvider()).start()
    client = door.client(server.url, clock=clock)
    door_call_ok = door.run(client)  # the host answers once
    assert door_call_ok is not None
    server.stop()  # now its port refuses connections
    client = door.client(server.url, clock=clock)
    with pytest.raises(door.sdk.APIConnectionError) as caught:
        door.run(client)
    refused = [e for e in _chain(caught.value) if isinstance(e, httpx2.ConnectError)]
    outcome = refused[0].rateloop_outcome  # type: ignore[attr-defined]
    # The transport's error bound, with the backoff between the attempts.
    assert outcome.attempts.loop == 5
    assert len(clock.sleeps) == 4


def _refused(port: int) -> Callable[[rateloop.Route], str]:
    def connect(route: rateloop.Route) -> str:
        socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
        return "answered"

    return connect


def test_rateloop_call_with_plain_exceptions_fails_fast_then_retries_once_answered() -> None:
    clock = FakeClock()
    loop = rateloop.RateLoop(Policy(max_error_attempts=3), clock=clock)
    # A route no call of this process has used: its endpoint has not answered.
    route = rateloop.Route(provider="local", model="m", project=f"p{closed_port()}")
    port = closed_port()
    outcome = loop.call(_refused(port), route=route)
    assert outcome.status is rateloop.Status.FAILED_RETRY_EXHAUSTED
    assert isinstance(outcome.error, ConnectionRefusedError)
    assert outcome.attempts.loop == 1 and clock.sleeps == []

    with socket.socket() as listening:  # the endpoint answers once...
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert loop.call(_refused(listening.getsockname()[1]), route=route).ok
    outcome = loop.call(_refused(port), route=route)  # ...so its refusal is now weather
    assert isinstance(outcome.error, ConnectionRefusedError)
    assert outcome.attempts.loop == 3 and len(clock.sleeps) == 2
