"""Outage discipline: stale connections, the local window's schedule, the share, deadlines.

The Redis cases run against a throwaway ``redis-server`` started here (it is
restarted and frozen, which the shared server must never be).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis

from _redis_server import free_port, redis_server
from rateloop.admission import LimitSpec
from rateloop.admission.backends import BackendUnreachable
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.limiter import LOCAL_RETRY_SECONDS, Limiter
from rateloop.admission.reservation import Denied, Reservation
from rateloop.errors import BackendError
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock

ROUTE = Route(provider="openai", model="gpt-5")
SCOPE = "openai:gpt-5"


class Switchable:
    """A real memory backend that can be made unreachable; counts the calls that reach it."""

    url = "switch://"

    def __init__(self, clock: FakeClock) -> None:
        self.inner = MemoryBackend(clock)
        self.down = False
        self.calls = 0

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        self.calls += 1
        if self.down:
            raise BackendUnreachable("switched off")
        return self.inner.execute(op)

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        return self.execute(op)

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def test_the_local_window_ends_on_schedule_whatever_fails_inside_it() -> None:
    clock = FakeClock()
    shared = Switchable(clock)
    limiter = Limiter(
        shared,
        limits={SCOPE: LimitSpec(requests_per_minute=600, input_tokens_per_minute=60_000)},
        clock=clock,
        on_unreachable="local",
    )
    held = limiter.try_reserve(ROUTE, Cost(input_tokens=100))
    assert isinstance(held, Reservation) and not held.local
    shared.down = True
    clock.advance(0.5)
    assert isinstance(limiter.try_reserve(ROUTE, Cost()), Denied | Reservation)  # window starts
    calls = shared.calls
    clock.advance(3.0)
    held.settle(10, 0)  # a settle still goes to the shared backend, and fails again ...
    assert shared.calls == calls + 1
    clock.advance(LOCAL_RETRY_SECONDS - 3.0 + 0.01)
    shared.down = False
    # ... but did not push the retry back: 5 s after the outage was noticed, shared again.
    again = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(again, Reservation) and not again.local


def test_the_local_share_is_respected_across_the_transition() -> None:
    """Just before the outage the shared bucket was spent: falling back adds no burst."""
    clock = FakeClock()
    shared = Switchable(clock)
    limiter = Limiter(
        shared,
        limits={SCOPE: LimitSpec(requests_per_minute=60, burst=1.0)},
        clock=clock,
        on_unreachable="local",
        local_share=0.5,
    )
    spent = 0
    while isinstance(limiter.try_reserve(ROUTE, Cost()), Reservation):
        spent += 1
    assert spent == 60
    shared.down = True
    d = limiter.try_reserve(ROUTE, Cost())
    # The local limiter starts full: at its share of the rate (30 a minute), one per 2 s.
    assert isinstance(d, Denied) and d.retry_after == pytest.approx(2.0)
    granted = 0
    for _ in range(40):  # 20 s, across several retry windows of the same outage
        clock.advance(0.5)
        while isinstance(limiter.try_reserve(ROUTE, Cost()), Reservation):
            granted += 1
    assert granted == pytest.approx(10, abs=1)  # 30 a minute × 20 s, no burst on top


@pytest.fixture
def own_redis() -> Iterator[int]:
    with redis_server() as port:
        yield port


def test_a_stale_connection_is_retried_once_before_redis_counts_as_down() -> None:
    """After a restart every pooled connection is stale; each is retried once, fresh."""
    port = free_port()
    limits = {SCOPE: LimitSpec(requests_per_minute=6_000, burst=1.0)}
    limiter = Limiter.from_url(f"redis://127.0.0.1:{port}/0", limits=limits, on_unreachable="local")

    async def five() -> list[Reservation | Denied]:
        return list(await asyncio.gather(*(limiter.atry_reserve(ROUTE, Cost()) for _ in range(5))))

    async def main() -> None:
        with redis_server(port=port):
            assert all(isinstance(r, Reservation) for r in await five())  # 5 pooled conns
            assert isinstance(limiter.try_reserve(ROUTE, Cost()), Reservation)
        with redis_server(port=port):  # restarted: every pooled connection is stale
            again = await five()
            assert all(isinstance(r, Reservation) and not r.local for r in again), again
            r = limiter.try_reserve(ROUTE, Cost())
            assert isinstance(r, Reservation) and not r.local
            await limiter.aclose()
            limiter.close()

    asyncio.run(main())


def test_the_callers_deadline_bounds_a_round_trip_to_a_frozen_redis(own_redis: int) -> None:
    url = f"redis://127.0.0.1:{own_redis}/0"
    limiter = Limiter.from_url(
        url, limits={SCOPE: LimitSpec(requests_per_minute=60)}, socket_timeout=10.0
    )
    assert limiter.try_reserve(ROUTE, Cost())  # connected, scripts loaded
    pid = _server_pid(own_redis)
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(BackendError):
            limiter.reserve(ROUTE, Cost(), deadline=0.5)
        assert time.monotonic() - start < 2.0  # not the 10 s socket timeout

        async def main() -> float:
            t0 = time.monotonic()
            with pytest.raises(BackendError):
                await limiter.areserve(ROUTE, Cost(), deadline=0.5)
            await limiter.aclose()
            return time.monotonic() - t0

        assert asyncio.run(main()) < 2.0
    finally:
        os.kill(pid, signal.SIGCONT)
        limiter.close()
    # Thawed: the same limiter works again (the timed-out connection was dropped).
    fresh = Limiter.from_url(url, limits={SCOPE: LimitSpec(requests_per_minute=60)})
    try:
        client = redis.Redis.from_url(url)
        client.ping()
        client.close()
    finally:
        fresh.close()


def _server_pid(port: int) -> int:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "info", "server"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    for line in out.splitlines():
        if line.startswith("process_id:"):
            return int(line.split(":", 1)[1])
    raise AssertionError(f"no process_id in INFO of the redis-server on {port}")
