"""Admission on a real Redis Cluster (three masters started here, on free ports).

Every key of a route carries the ``{provider:model}`` hash tag, so the one
script an admission runs touches a single slot: it works on a cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from _redis_server import redis_cluster
from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied, Reservation
from rateloop.route import Cost, Route


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    with redis_cluster(3) as ports:
        yield f"redis+cluster://127.0.0.1:{ports[0]}/0"


ROUTES = [
    Route(provider="openai", model="gpt-5", project="p1", tenant="t1"),
    Route(provider="anthropic", model="claude-sonnet-4", project="p2"),
    Route(provider="gemini", model="flash", project="p3", tenant="t9"),
]


def test_admission_settle_pause_and_learning_on_a_cluster(cluster_url: str) -> None:
    limits = {
        "openai:gpt-5": LimitSpec(requests_per_minute=120, output_tokens_per_minute=60_000),
        "openai:gpt-5:p1": LimitSpec(concurrency=2),
        "openai:gpt-5:p1:t1": LimitSpec(concurrency=3),  # a second lease set, same slot
        "anthropic:claude-sonnet-4:p2": LimitSpec(requests_per_minute=60, burst=1.0),
    }
    limiter = Limiter.from_url(cluster_url, prefix="rl-cluster:", limits=limits)
    try:
        a = limiter.try_reserve(ROUTES[0], Cost(output_tokens=500))
        b = limiter.try_reserve(ROUTES[0], Cost(output_tokens=500))
        assert isinstance(a, Reservation) and isinstance(b, Reservation)
        held = limiter.try_reserve(ROUTES[0], Cost())
        assert isinstance(held, Denied) and held.dimension is not None  # 2 leases or pacing
        client = RedisCluster.from_url(cluster_url.replace("+cluster", ""))
        found = client.scan_iter(match="rl-cluster:*:l:*", target_nodes="all")
        leases = [k.decode() for k in found]
        assert sorted(leases) == [
            "rl-cluster:{openai:gpt-5}:l:openai:gpt-5:p1",
            "rl-cluster:{openai:gpt-5}:l:openai:gpt-5:p1:t1",
        ]
        assert all(client.zcard(k) == 2 for k in leases)
        a.settle(0, 100)
        b.release()
        assert all(client.zcard(k) == 0 for k in leases)  # freed in both sets
        granted = 0
        while isinstance(limiter.try_reserve(ROUTES[1], Cost()), Reservation):
            granted += 1
        assert granted == 60
        limiter.pause("gemini:flash", 30.0, "retry-after: 30")
        d = limiter.try_reserve(ROUTES[2], Cost())
        assert isinstance(d, Denied) and d.retry_after >= 30.0
        limiter.observe(
            "gemini:flash:p3",
            {"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "0"},
        )

        async def main() -> Reservation | Denied:
            r = await limiter.atry_reserve(ROUTES[1], Cost())
            await limiter.aclose()
            return r

        assert isinstance(asyncio.run(main()), Denied)  # the shared bucket, from asyncio too
        # The keys of one route share a slot; different routes spread over the nodes.
        keys = [k.decode() for k in client.scan_iter(match="rl-cluster:*", target_nodes="all")]
        slots = {client.keyslot(k) for k in keys if "{openai:gpt-5}" in k}
        assert len(slots) == 1 and len(keys) >= 4
        client.close()
    finally:
        limiter.close()
