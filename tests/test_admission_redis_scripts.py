"""The Redis admission scripts generated per plan shape (``backends/scripts.py`` + ``admit.lua``).

The conformance suites run the common plans on Redis; these tests cover what
is particular to generating one script per shape: the widest plan a route can
have still compiles (Lua caps a function's locals) and decides like the memory
backend, plans that differ only in their limits share one script, and a
server whose script cache was flushed gets the script again.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Iterator

import pytest
import redis

from rateloop.admission import LimitSpec
from rateloop.admission.backends.redis import RedisBackend
from rateloop.admission.backends.scripts import admit_script, shape_of
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied, Reservation
from rateloop.errors import BackendError
from rateloop.route import Cost, Route
from rateloop.signal import Dimension
from rateloop.testing import FakeClock

ROUTE = Route(provider="openai", model="gpt-5", project="proj-1", tenant="t-1")


def every_dimension(**fields: object) -> LimitSpec:
    spec: dict[str, object] = {
        "requests_per_minute": 10_000,
        "input_tokens_per_minute": 10**7,
        "output_tokens_per_minute": 10**7,
        "tokens_per_minute": 10**7,
        "requests_per_day": 10**6,
        "burst": 1.0,
        "profile": "generic",
    }
    spec.update(fields)
    return LimitSpec(**spec)  # type: ignore[arg-type]


#: Three scopes, every dimension in each: 17 checks, both kinds of day window, leases
#: in two scopes (each counts its own; a settle frees the lease in both).
WIDEST = {
    "openai:gpt-5": every_dimension(),
    "openai:gpt-5:proj-1": every_dimension(day_window="rolling", concurrency=3),
    "openai:gpt-5:proj-1:t-1": every_dimension(requests_per_day=3, concurrency=2),
}


@pytest.fixture
def limiters(redis_url: str, redis_prefix: str) -> Iterator[tuple[Limiter, Limiter]]:
    on_redis = Limiter.from_url(redis_url, prefix=redis_prefix, limits=WIDEST)
    in_memory = Limiter(clock=FakeClock(), rng=random.Random(1), limits=WIDEST)
    yield on_redis, in_memory
    on_redis.close()
    in_memory.close()


def test_the_widest_plan_decides_like_the_memory_backend(
    limiters: tuple[Limiter, Limiter],
) -> None:
    outcomes: list[list[object]] = []
    for limiter in limiters:
        seen: list[object] = []
        held = []
        for _ in range(4):
            r = limiter.try_reserve(ROUTE, Cost(input_tokens=100, output_tokens=50))
            if isinstance(r, Reservation):
                held.append(r)
                seen.append("granted")
            else:
                assert isinstance(r, Denied)
                seen.append((r.scope, r.dimension))
        held[0].settle(80, 20)  # frees a lease and refunds tokens in every scope
        r = limiter.try_reserve(ROUTE, Cost(input_tokens=100, output_tokens=50))
        seen.append("granted" if isinstance(r, Reservation) else (r.scope, r.dimension))
        r = limiter.try_reserve(ROUTE, Cost(input_tokens=100, output_tokens=50))
        seen.append("granted" if isinstance(r, Reservation) else (r.scope, r.dimension))
        outcomes.append(seen)
    tenant = "openai:gpt-5:proj-1:t-1"
    # Two leases, then the third call waits for one; settling frees it; the day's
    # three requests are then spent.
    assert outcomes[0] == [
        "granted",
        "granted",
        (tenant, Dimension.CONCURRENCY),
        (tenant, Dimension.CONCURRENCY),
        "granted",
        (tenant, Dimension.REQUESTS_PER_DAY),
    ]
    assert outcomes[0] == outcomes[1]


def test_plans_that_differ_only_in_limits_share_one_script(
    redis_url: str, redis_prefix: str
) -> None:
    backend = RedisBackend(redis_url, prefix=redis_prefix)
    small = {"openai:gpt-5": every_dimension(requests_per_minute=60, concurrency=3)}
    large = {"openai:gpt-5": every_dimension(requests_per_minute=6_000, concurrency=300)}
    plans = []
    for limits in (small, large):
        limiter = Limiter(backend, limits=limits)
        plans.append(limiter._known.plan(Route(provider="openai", model="gpt-5"), "interactive"))
    a, b = (backend.codec.encoded(p) for p in plans)
    assert a.script == b.script  # one SHA: the limits are arguments, not part of the text
    assert a.shared != b.shared  # ... which differ
    other = shape_of(plans[0], {"openai:gpt-5": 1}, 1)
    assert admit_script(other, history=True) == a.script.text  # the history is on by default
    backend.close()


def test_a_flushed_script_cache_gets_the_script_again(redis_url: str, redis_prefix: str) -> None:
    limits = {"openai:gpt-5": every_dimension()}
    # A server of its own would do too; flushing the shared test server's cache is
    # harmless (every client reloads on NOSCRIPT), but use a fresh one to stay apart.
    from _redis_server import redis_server

    with redis_server() as port:
        url = f"redis://127.0.0.1:{port}/0"
        limiter = Limiter.from_url(url, prefix=redis_prefix, limits=limits)
        try:
            route = Route(provider="openai", model="gpt-5")
            assert isinstance(limiter.try_reserve(route, Cost()), Reservation)
            admin = redis.Redis.from_url(url)
            admin.script_flush()
            assert isinstance(limiter.try_reserve(route, Cost()), Reservation)
            assert admin.info("commandstats")["cmdstat_eval"]["calls"] == 2
            admin.close()
        finally:
            limiter.close()


def test_the_largest_shape_compiles(redis_url: str) -> None:
    """Every dimension in three scopes, a day window and a lease in each: 18 checks.

    Lua allows 200 locals per function; the generated script keeps a few per check.
    """
    checks = []
    for scope in (1, 2, 3):
        for field in ("requests", "input_tokens", "output_tokens", "tokens"):
            checks.append((scope, field, "b", True))
        checks.append((scope, "requests_per_day", "d", False))
        checks.append((scope, "concurrency", "l", False))
    client = redis.Redis.from_url(redis_url)
    try:
        sha = client.script_load(admit_script((3, (1, 2, 3), tuple(checks))))
        assert client.script_exists(sha) == [True]
    finally:
        client.close()


def _server_pid(client: redis.Redis) -> int:
    return int(client.info("server")["process_id"])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_cut_off_mid_answer_leaves_no_reply_for_the_next(mode: str) -> None:
    """The kept connection is dropped when a call is cut off before its answer.

    Redis is frozen while an admission waits for its answer: the caller's
    deadline (sync) or a cancellation (async) cuts it off.  Thawed, Redis
    sends that answer; had the connection been kept, the next call -- a
    pause, whose answer has another form -- would read it instead of its own.
    """
    from _redis_server import redis_server

    limits = {"openai:gpt-5": every_dimension()}
    route = Route(provider="openai", model="gpt-5")
    with redis_server() as port:
        url = f"redis://127.0.0.1:{port}/0"
        limiter = Limiter.from_url(url, limits=limits, socket_timeout=10.0)
        admin = redis.Redis.from_url(url)
        pid = _server_pid(admin)

        async def cut_then_pause() -> None:
            assert isinstance(await limiter.atry_reserve(route, Cost()), Reservation)
            os.kill(pid, signal.SIGSTOP)
            try:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(limiter.atry_reserve(route, Cost()), 0.3)
            finally:
                os.kill(pid, signal.SIGCONT)
            await limiter.apause("openai:gpt-5", 0.5, "test")
            await limiter.aclose()

        try:
            if mode == "async":
                asyncio.run(cut_then_pause())
            else:
                assert isinstance(limiter.try_reserve(route, Cost()), Reservation)
                os.kill(pid, signal.SIGSTOP)
                try:
                    with pytest.raises(BackendError):
                        limiter.reserve(route, Cost(), deadline=0.3)
                finally:
                    os.kill(pid, signal.SIGCONT)
                limiter.pause("openai:gpt-5", 0.5, "test")
            denied = limiter.try_reserve(route, Cost())
            assert isinstance(denied, Denied) and denied.scope == "openai:gpt-5"
        finally:
            admin.close()
            limiter.close()
