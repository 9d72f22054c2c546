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
