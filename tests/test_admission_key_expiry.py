"""Every key the Redis scripts write expires on its own: no scan ever has to clean a scope.

A fleet with many tenants leaves behind the keys of every tenant that goes
quiet.  Redis drops them itself only if each one has a TTL, so this test
drives every script that writes (admit with buckets, day windows and leases,
settle, release, pause, observe with a block and an AIMD decrease, the limits
learned from headers) on many scopes of several routes, and then reads the
TTL of every key under the prefix: each one must have one, and it must be no
longer than what its state needs (plus the scripts' minute of slack).
"""

from __future__ import annotations

import pytest
import redis

from rateloop.admission.history import HISTORY_TTL_SECONDS
from rateloop.admission.learning import LEARNED_TTL_SECONDS
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route
from rateloop.signal import Kind, LimitSignal

MODELS = ("m0", "m1", "m2")
TENANTS = 8
LEASE_TTL = 120.0
PAUSE = 30.0
BLOCK = 20.0
SLACK = 60 + 1 + 1  # the scripts' slack, their one second, and a second of rounding

#: The longest each kind of key may live, in seconds (``rateloop.admission.backends.keys``).
BOUND = {
    "s": 86_400 + SLACK,  # a fixed day window lives until its reset: at most a day
    "l": LEASE_TTL + 1 + 1,  # the lease set: the lease TTL, a second more
    "h": 3_600 + HISTORY_TTL_SECONDS,  # an hour's history: a day after its hour ends
    "k": LEARNED_TTL_SECONDS,
}


def _kind(prefix: str, key: str) -> str:
    return key[len(prefix) :].split("}:", 1)[1].split(":", 1)[0]


@pytest.mark.redis
def test_every_key_redis_scripts_write_has_a_bounded_ttl(redis_url: str, redis_prefix: str) -> None:
    limits: dict[str, LimitSpec] = {}
    for m in MODELS:
        limits[f"scale:{m}"] = LimitSpec(
            requests_per_minute=6_000,
            tokens_per_minute=10**7,
            requests_per_day=10**6,
            concurrency=1_000,
            lease_ttl_secs=LEASE_TTL,
        )
        for t in range(TENANTS):
            limits[f"scale:{m}:p:t{t}"] = LimitSpec(
                requests_per_minute=60,
                output_tokens_per_minute=60_000,
                requests_per_day=1_000,
                day_window="rolling",
                concurrency=4,
                lease_ttl_secs=LEASE_TTL,
            )
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits=limits)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        held = []
        for m in MODELS:
            for t in range(TENANTS):
                route = Route(provider="scale", model=m, project="p", tenant=f"t{t}")
                r = limiter.try_reserve(route, Cost(input_tokens=100, output_tokens=500))
                assert isinstance(r, Reservation), r
                if t % 3 == 0:
                    r.settle(80, 100)  # a refund: the settle script and its history
                elif t % 3 == 1:
                    r.release()
                else:
                    held.append(r)  # its lease stays in the lease sets
            limiter.pause(f"scale:{m}:p:t0", PAUSE, "retry-after: 30")
            limiter.observe(
                f"scale:{m}:p",
                {
                    "x-ratelimit-limit-requests": "60",
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": f"{BLOCK:g}s",
                },
            )
            limiter.observe(f"scale:{m}:p", LimitSignal.of(Kind.TEMPORARY))  # AIMD decrease
        # Zero-config: limits learned from the headers of a route with none configured.
        learner = Route(provider="zero", model="z", project="p")
        limiter.observe(
            learner.provider_scope,
            {
                "x-ratelimit-limit-requests": "500",
                "x-ratelimit-remaining-requests": "499",
                "x-ratelimit-limit-tokens": "30000",
                "x-ratelimit-remaining-tokens": "29000",
            },
        )
        assert isinstance(limiter.try_reserve(learner, Cost(input_tokens=10)), Reservation)

        keys = sorted(client.scan_iter(match=f"{redis_prefix}*", count=1_000))
        ttls = {k: client.pttl(k) / 1_000 for k in keys}
        kinds = {_kind(redis_prefix, k) for k in keys}
        assert kinds == set(BOUND), kinds  # every kind of key was written
        # A state hash and a history hash per tenant at least (a lease set goes with its
        # last lease).
        assert len(keys) >= 2 * len(MODELS) * TENANTS
        without = [k for k, ttl in ttls.items() if ttl < 0]
        assert without == [], f"keys without an expiry: {without}"
        too_long = {k: ttl for k, ttl in ttls.items() if ttl > BOUND[_kind(redis_prefix, k)]}
        assert too_long == {}, too_long
        for r in held:
            r.release()
    finally:
        client.close()
        limiter.close()
