"""Held capacity (``enqueued_tokens``): one suite on the memory backend and the real Redis."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest

from rateloop.admission import HeldCapacity, Limiter, LimitSpec
from rateloop.errors import ConfigError
from rateloop.testing import FakeClock

SCOPE = "openai:gpt-x:p1:batch"


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def queue(request: pytest.FixtureRequest) -> Iterator[HeldCapacity]:
    limits = {SCOPE: LimitSpec(enqueued_tokens=100)}
    if request.param == "redis":
        lim = Limiter.from_url(request.getfixturevalue("redis_url"),
                               prefix=request.getfixturevalue("redis_prefix"), limits=limits,
                               rng=random.Random(1))
    else:
        lim = Limiter(limits=limits, clock=FakeClock(), rng=random.Random(1))
    yield HeldCapacity(lim)
    lim.close()


def test_holds_count_against_the_limit_until_released(queue: HeldCapacity) -> None:
    first = queue.hold(SCOPE, "b1", 70, ttl=3600)
    assert first and (first.held, first.limit) == (70, 100)
    denied = queue.hold(SCOPE, "b2", 40, ttl=3600)
    assert not denied and denied.held == 70 and not denied.never_fits
    assert queue.hold(SCOPE, "b3", 30, ttl=3600).held == 100
    assert queue.release(SCOPE, "b1") and not queue.release(SCOPE, "b1")
    assert queue.hold(SCOPE, "b2", 40, ttl=3600).held == 70
    assert queue.held(SCOPE) == 70


def test_holding_a_key_again_replaces_it_and_never_counts_twice(queue: HeldCapacity) -> None:
    assert queue.hold(SCOPE, "b1", 90, ttl=3600)
    again = queue.hold(SCOPE, "b1", 90, ttl=3600)  # a redelivered worker holds again
    assert again and again.held == 90 and queue.held(SCOPE) == 90


def test_an_amount_over_the_limit_never_fits_and_other_scopes_are_unlimited(
        queue: HeldCapacity) -> None:
    big = queue.hold(SCOPE, "b1", 101, ttl=3600)
    assert not big and big.never_fits
    free = queue.hold("openai:other:p1:batch", "b1", 10**9, ttl=3600)
    assert free and free.limit is None


def test_a_hold_expires_after_its_ttl_so_a_lost_task_cannot_leak_it() -> None:
    clock = FakeClock()
    queue = HeldCapacity(Limiter(limits={SCOPE: LimitSpec(enqueued_tokens=100)}, clock=clock))
    assert queue.hold(SCOPE, "b1", 100, ttl=60)
    assert not queue.hold(SCOPE, "b2", 1, ttl=60)
    clock.advance(60)
    assert queue.hold(SCOPE, "b2", 1, ttl=60) and queue.held(SCOPE) == 1


@pytest.mark.redis
def test_a_hold_expires_on_redis_by_the_servers_clock(redis_url: str, redis_prefix: str) -> None:
    import redis

    lim = Limiter.from_url(redis_url, prefix=redis_prefix,
                           limits={SCOPE: LimitSpec(enqueued_tokens=100)})
    try:
        queue = HeldCapacity(lim)
        assert queue.hold(SCOPE, "b1", 100, ttl=0.2)
        client = redis.Redis.from_url(redis_url)
        key = f"{redis_prefix}{{openai:gpt-x}}:q:{SCOPE}"
        assert client.hexists(key, "b1") and client.ttl(key) > 0  # the hash expires too
        client.close()
        # The server's clock decides: wait for it, a real wait, bounded.
        give_up = time.monotonic() + 5
        while queue.held(SCOPE) and time.monotonic() < give_up:
            time.sleep(0.02)
        assert queue.held(SCOPE) == 0
    finally:
        lim.close()


def test_bad_values_are_named() -> None:
    queue = HeldCapacity(Limiter(clock=FakeClock()))
    with pytest.raises(ValueError, match="amount must be an integer >= 0, got -1"):
        queue.hold(SCOPE, "b", -1, ttl=1)
    with pytest.raises(ValueError, match="ttl must be a number of seconds > 0, got 0"):
        queue.hold(SCOPE, "b", 1, ttl=0)
    with pytest.raises(ValueError, match="key must be a non-empty string"):
        queue.hold(SCOPE, "", 1, ttl=1)
    with pytest.raises(ConfigError, match="enqueued_tokens"):
        LimitSpec(enqueued_tokens=0)
