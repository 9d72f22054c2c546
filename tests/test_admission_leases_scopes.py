"""Concurrency limits on several scopes of one route: each scope counts its own leases.

A route's plan can hold a LEASE check in more than one scope (a provider-wide
concurrency limit and a per-tenant one).  Each check counts the leases held
in its own scope -- a tenant's limit counts only that tenant's calls, the
provider's every tenant's -- and settling or releasing a reservation frees
its slot in every one of them at once (no lease waits for its TTL).  Memory
and Redis decide alike; on Redis each scope has its own lease set, in the
route's hash slot, and an admission or a settle is still one script call.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest
import redis

import _limiters
from _redis_server import redis_server
from rateloop.admission import LimitSpec
from rateloop.admission.backends import BackendUnreachable
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied, Reservation
from rateloop.route import Cost, Route
from rateloop.signal import Dimension
from rateloop.testing import FakeClock

limiter = _limiters.limiter  # memory, then the real Redis

PROVIDER = "openai:gpt-5"
PROJECT = "openai:gpt-5:p"
A = Route(provider="openai", model="gpt-5", project="p", tenant="a")
B = Route(provider="openai", model="gpt-5", project="p", tenant="b")
LIMITS = {
    PROVIDER: LimitSpec(concurrency=3),
    A.scope: LimitSpec(concurrency=2),
    B.scope: LimitSpec(concurrency=2),
}


def configure(limiter: Limiter, limits: dict[str, LimitSpec] = LIMITS) -> None:
    for scope, spec in limits.items():
        limiter.set_limits(scope, spec)


def held(result: Reservation | Denied) -> Reservation:
    assert isinstance(result, Reservation), result
    return result


def blocked(result: Reservation | Denied) -> tuple[str | None, Dimension | None]:
    assert isinstance(result, Denied), result
    assert 0 < result.retry_after <= 0.05 + 0.15  # a lease wait polls, it never blocks
    return result.scope, result.dimension


def run_round(limiter: Limiter) -> list[Reservation]:
    """A takes its 2 slots, B gets 1 (the provider's third), then both are denied."""
    a1, a2 = held(limiter.try_reserve(A, Cost())), held(limiter.try_reserve(A, Cost()))
    assert blocked(limiter.try_reserve(A, Cost())) == (A.scope, Dimension.CONCURRENCY)
    b1 = held(limiter.try_reserve(B, Cost()))  # B's own limit counts only B's lease
    assert blocked(limiter.try_reserve(B, Cost())) == (PROVIDER, Dimension.CONCURRENCY)
    assert blocked(limiter.try_reserve(A, Cost())) == (PROVIDER, Dimension.CONCURRENCY)
    return [a1, a2, b1]


def test_each_scope_counts_its_own_leases_and_settling_frees_them_all(limiter: Limiter) -> None:
    configure(limiter)
    a1, a2, b1 = run_round(limiter)
    b1.release()  # the provider's third slot and B's slot are free again, at once
    b2 = held(limiter.try_reserve(B, Cost()))
    a1.settle(0, 0)
    a2.release()
    b2.settle(0, 0)
    # Every slot of every scope is free again -- no lease waits for its TTL.
    for r in run_round(limiter):
        r.release()
    for r in run_round(limiter):
        r.settle(0, 0)


def test_a_provider_wide_limit_counts_every_tenant(limiter: Limiter) -> None:
    configure(limiter, {**LIMITS, PROVIDER: LimitSpec(concurrency=2)})
    a = held(limiter.try_reserve(A, Cost()))
    b = held(limiter.try_reserve(B, Cost()))
    assert blocked(limiter.try_reserve(A, Cost())) == (PROVIDER, Dimension.CONCURRENCY)
    assert blocked(limiter.try_reserve(B, Cost())) == (PROVIDER, Dimension.CONCURRENCY)
    a.release()
    a = held(limiter.try_reserve(A, Cost()))
    a.settle(0, 0)
    b.settle(0, 0)
    for _ in range(2):
        pair = [held(limiter.try_reserve(A, Cost())), held(limiter.try_reserve(A, Cost()))]
        assert blocked(limiter.try_reserve(B, Cost())) == (PROVIDER, Dimension.CONCURRENCY)
        for r in pair:
            r.release()


def test_three_scopes_with_leases_and_the_async_twins(limiter: Limiter) -> None:
    configure(limiter, {**LIMITS, PROJECT: LimitSpec(concurrency=3)})

    async def main() -> None:
        try:
            for _ in range(2):
                a = [held(await limiter.atry_reserve(A, Cost())) for _ in range(2)]
                b = held(await limiter.atry_reserve(B, Cost()))
                d = await limiter.atry_reserve(B, Cost())
                # Provider and project are both full: the broadest scope is named.
                assert blocked(d) == (PROVIDER, Dimension.CONCURRENCY)
                for r in (*a, b):
                    await r.arelease()
        finally:
            await limiter.aclose()

    asyncio.run(main())


def test_a_lease_expires_after_its_own_scopes_ttl() -> None:
    clock = FakeClock()
    limiter = Limiter(
        clock=clock,
        rng=random.Random(1),
        limits={
            PROVIDER: LimitSpec(concurrency=3, lease_ttl_secs=600),
            A.scope: LimitSpec(concurrency=1, lease_ttl_secs=10),
        },
    )
    held(limiter.try_reserve(A, Cost()))  # its holder crashes: never settled
    assert blocked(limiter.try_reserve(A, Cost())) == (A.scope, Dimension.CONCURRENCY)
    clock.advance(10.5)
    b = held(limiter.try_reserve(A, Cost()))  # A's slot expired; the provider's holds 2 now
    held(limiter.try_reserve(B, Cost()))
    assert blocked(limiter.try_reserve(B, Cost())) == (PROVIDER, Dimension.CONCURRENCY)
    b.release()
    held(limiter.try_reserve(B, Cost()))


class Unreachable:
    """A shared backend that is always down: every admission runs on the local fallback."""

    url = "down://"

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        raise BackendUnreachable("down")

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        raise BackendUnreachable("down")

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def test_the_local_fallback_counts_each_scope_too() -> None:
    limiter = Limiter(
        Unreachable(),  # type: ignore[arg-type]
        clock=FakeClock(),
        rng=random.Random(1),
        limits=LIMITS,
        on_unreachable="local",
        local_share=1.0,
    )
    for _ in range(3):
        reservations = run_round(limiter)
        assert all(r.local for r in reservations)
        for r in reservations:
            r.release()
    assert isinstance(limiter._runner.local, MemoryBackend)


@pytest.fixture
def fresh_redis() -> Iterator[str]:
    """A server of its own: its command counts are this test's alone."""
    with redis_server() as port:
        yield f"redis://127.0.0.1:{port}/0"


def test_redis_keeps_one_lease_set_per_scope_in_one_slot_one_call_each(
    fresh_redis: str,
) -> None:
    prefix = "rl-leases:"
    limiter = Limiter.from_url(fresh_redis, prefix=prefix, limits=LIMITS)
    admin = redis.Redis.from_url(fresh_redis, decode_responses=True)
    try:
        for r in run_round(limiter):  # plans built, scripts loaded: then count
            r.release()
        admin.config_resetstat()
        a = [held(limiter.try_reserve(A, Cost())) for _ in range(2)]
        b = held(limiter.try_reserve(B, Cost()))
        key = f"{prefix}{{{PROVIDER}}}:l:"  # every key of the route carries its hash tag
        sizes = {s: admin.zcard(key + s) for s in (PROVIDER, PROJECT, A.scope, B.scope)}
        assert sizes == {PROVIDER: 3, PROJECT: 0, A.scope: 2, B.scope: 1}
        assert admin.zrange(key + B.scope, 0, -1) == [b.lease_id]
        assert set(admin.zrange(key + A.scope, 0, -1)) == {r.lease_id for r in a}
        for r in (*a, b):
            r.settle(0, 0)
        assert admin.keys(f"{prefix}*:l:*") == []  # every lease removed from every set
        stats = admin.info("commandstats")
        calls = {c: stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval")}
        assert calls == {"evalsha": 3 + 3, "eval": 0}  # one call per admission, per settle
    finally:
        admin.close()
        limiter.close()
