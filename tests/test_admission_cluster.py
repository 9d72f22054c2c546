"""Admission on a real Redis Cluster (three masters started here, on free ports).

Every key of a route carries the ``{provider:model}`` hash tag, so the one
script an admission runs touches a single slot: it works on a cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
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


def test_admission_follows_a_slot_moved_to_another_node(cluster_url: str) -> None:
    """The limiter sends each script to the node its slot map names; a slot resharded
    since (``MOVED``) is followed, the map refreshed, and the scope's state moves with it.
    """
    route = Route(provider="moved", model="m", project="p")
    limiter = Limiter.from_url(
        cluster_url,
        prefix="rl-moved:",
        limits={"moved:m": LimitSpec(requests_per_minute=60, burst=1.0)},  # 60 at once
    )
    client = RedisCluster.from_url(cluster_url.replace("+cluster", ""), decode_responses=True)
    try:
        granted = sum(
            isinstance(limiter.try_reserve(route, Cost()), Reservation) for _ in range(25)
        )
        assert granted == 25
        slot = client.keyslot("{moved:m}")
        owner = client.get_node_from_key("{moved:m}")
        target = next(n for n in client.get_primaries() if n.name != owner.name)
        src, dst = (
            redis.Redis(host=n.host, port=n.port, decode_responses=True) for n in (owner, target)
        )
        src_id, dst_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100)
        assert keys  # the scope's state (and history) is there
        src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
        for node in client.get_primaries():
            with redis.Redis(host=node.host, port=node.port) as each:
                each.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
        src.close()
        dst.close()
        # The limiter's map still names the old owner: it answers MOVED, and the call
        # goes to the new one, where the bucket holds the 25 already admitted.
        more = sum(isinstance(limiter.try_reserve(route, Cost()), Reservation) for _ in range(50))
        assert more == 35
    finally:
        client.close()
        limiter.close()


def test_a_cluster_admission_goes_straight_to_its_node(
    cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the slot map current, a script is sent packed on its node's connection:
    redis-py's cluster client (its routing, per-call packing) is not in the way."""
    route = Route(provider="straight", model="m", project="p", tenant="t")
    limiter = Limiter.from_url(
        cluster_url,
        prefix="rl-straight:",
        limits={"straight:m:p:t": LimitSpec(requests_per_minute=6_000, concurrency=50)},
    )
    routed: list[object] = []
    through = RedisCluster.evalsha

    def spy(self: RedisCluster, *args: object, **kwargs: object) -> object:
        routed.append(args)
        return through(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RedisCluster, "evalsha", spy)
    try:
        held = [limiter.try_reserve(route, Cost(input_tokens=10)) for _ in range(20)]
        assert all(isinstance(r, Reservation) for r in held)
        for r in held:
            assert isinstance(r, Reservation)
            r.settle(5, 0)
        assert routed == []
    finally:
        limiter.close()


def test_a_batch_is_pipelined_per_node_and_answered_in_order(cluster_url: str) -> None:
    """``execute_many`` (the lease renewals' batch): one pipeline per node, each answer
    back in its op's place."""
    from rateloop.admission.backends.redis import RedisBackend
    from test_admission_local_leases import _op, _plan

    backend = RedisBackend(cluster_url, prefix="rl-many:")
    spec = LimitSpec(requests_per_minute=180, burst=1 / 60)  # 3 at once
    plans = [_plan(spec, f"many{i}:m") for i in range(6)]  # six hash tags: spread over nodes
    client = RedisCluster.from_url(cluster_url.replace("+cluster", ""))
    try:
        nodes = {client.get_node_from_key("{" + p.scopes[0] + "}").name for p in plans}
        assert len(nodes) > 1
        ops: list[object] = [_op(p, 1.0) for p in plans for _ in range(4)]
        answers = backend.execute_many(ops)
        granted = [a.granted for a in answers]  # type: ignore[attr-defined]
        assert granted == [True, True, True, False] * 6
    finally:
        client.close()
        backend.close()
