"""Many tenants on Redis: memory per scope, latency at 100k scopes against 100, expiry.

Usage::

    python bench/tenants_bench.py [--tenants 100000] [--models 10] [--calls 3000]
        [--rounds 5] [--redis URL] [--wait-expiry]

Each tenant scope ``bench:m{k}:p:t{j}`` has its own limit
(``requests_per_minute=10**6``: nothing is denied), the model scopes a shared
one; tenants are spread over ``models`` models.  By default the bench starts
its own ``redis-server`` (a private one, so ``INFO memory`` measures only these
keys; stopped at the end); ``--redis`` uses a server you name, under a fresh
prefix deleted at the end.

1. **100 scopes.** 100 tenants admit once each; then ``rounds`` of ``calls``
   admissions on random tenants among them (``perf_counter`` per call).
2. **100k scopes.** Every other tenant admits once (``INFO memory``
   ``used_memory`` before and after: the delta per tenant; ``MEMORY USAGE``
   of a sample of each kind of key); then interleaved rounds of ``calls``
   admissions on random tenants among the first 100 ("hot") and among all of
   them ("all"), p50 / p99 / p99.9 and the script's µs per call in Redis
   (``INFO commandstats``).
3. **Expiry.** The TTL of every key under the prefix (a ``SCAN`` to *check*
   it; nothing relies on it to clean up).  ``--wait-expiry`` then waits until
   the state hashes have expired on their own (their TTL: the bucket's drain
   plus a minute) and reports the keys and memory left: one history hash per
   tenant, which expires a day after its hour ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_bench import load, pct

from _redis_server import redis_server
from rateloop.admission.backends.keys import scope_of_key
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route

TENANT = LimitSpec(requests_per_minute=10**6)  # room: latency, not denials, is measured
MODEL = LimitSpec(requests_per_minute=10**9)


@contextlib.contextmanager
def target(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with redis_server() as port:
        yield f"redis://127.0.0.1:{port}/0"


def kind_of(prefix: str, key: str) -> str:
    parsed = scope_of_key(prefix, key)
    if parsed is not None:
        return parsed[0]
    return key[len(prefix) :].split("}:", 1)[1].split(":", 1)[0]  # a history hash: 'h'


def evalsha(client: redis.Redis) -> tuple[int, int]:
    s = client.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(s["calls"]), int(s["usec"])


def timed(limiter: Limiter, routes: list[Route], picks: list[int]) -> list[float]:
    out = []
    cost = Cost()
    for i in picks:
        t0 = time.perf_counter()
        r = limiter.try_reserve(routes[i], cost)
        out.append(time.perf_counter() - t0)
        if not isinstance(r, Reservation):
            raise RuntimeError(f"a tenant was denied: {r}")  # the limits leave room
    return out


def summary(name: str, lat: list[float], server: list[int]) -> str:
    lat = sorted(lat)
    calls, usec = server
    per = usec / calls if calls else 0.0
    return (
        f"{name:26} n={len(lat):>6}  p50 {pct(lat, 50) * 1e6:7.0f} µs"
        f"  p99 {pct(lat, 99) * 1e6:7.0f} µs  p99.9 {pct(lat, 99.9) * 1e6:7.0f} µs"
        f"  server {per:5.1f} µs/script"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--tenants", type=int, default=100_000)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--calls", type=int, default=3_000, help="admissions per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis", help="a Redis URL (default: a private redis-server)")
    parser.add_argument("--wait-expiry", action="store_true")
    args = parser.parse_args()
    if args.tenants < 100 or args.models < 1:
        parser.error(
            f"--tenants must be >= 100 and --models >= 1, got {args.tenants}, {args.models}"
        )
    prefix = f"rateloop-tenants:{uuid.uuid4().hex[:8]}:"
    print(f"load before: {load()}", flush=True)
    routes = [
        Route(provider="bench", model=f"m{j % args.models}", project="p", tenant=f"t{j}")
        for j in range(args.tenants)
    ]
    limits = {f"bench:m{k}": MODEL for k in range(args.models)}
    limits.update({r.scope: TENANT for r in routes})
    rng = random.Random(7)
    with target(args.redis) as url:
        client = redis.Redis.from_url(url, decode_responses=True)
        limiter = Limiter.from_url(url, prefix=prefix, limits=limits)
        try:
            # 1. 100 scopes
            timed(limiter, routes, list(range(100)))
            hot_only: list[float] = []
            s0 = evalsha(client)
            for _ in range(args.rounds):
                hot_only += timed(limiter, routes, [rng.randrange(100) for _ in range(args.calls)])
            s1 = evalsha(client)
            print(summary("100 scopes in Redis", hot_only, [s1[0] - s0[0], s1[1] - s0[1]]))

            # 2. 100k scopes
            client.memory_purge() if args.redis is None else None
            before = int(client.info("memory")["used_memory"])
            keys_before = client.dbsize()
            start = time.perf_counter()
            timed(limiter, routes, list(range(100, args.tenants)))
            filled = time.perf_counter() - start
            after = int(client.info("memory")["used_memory"])
            keys_after = client.dbsize()
            added = args.tenants - 100
            print(
                f"filled {added:,} tenants in {filled:.1f} s; keys +{keys_after - keys_before:,}; "
                f"used_memory +{(after - before) / 2**20:.1f} MiB = "
                f"{(after - before) / added:.0f} B per tenant"
            )
            rounds: dict[str, list[float]] = defaultdict(list)
            server: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for n in range(args.rounds):
                for name in ("hot", "all") if n % 2 else ("all", "hot"):
                    top = 100 if name == "hot" else args.tenants
                    a = evalsha(client)
                    rounds[name] += timed(
                        limiter, routes, [rng.randrange(top) for _ in range(args.calls)]
                    )
                    b = evalsha(client)
                    server[name][0] += b[0] - a[0]
                    server[name][1] += b[1] - a[1]
            for name, label in (("hot", "100 used"), ("all", "all used")):
                print(summary(f"{args.tenants:,} in Redis, {label}", rounds[name], server[name]))

            # 3. memory by kind of key, and every key's TTL
            keys = list(client.scan_iter(match=f"{prefix}*", count=10_000))
            kinds = Counter(kind_of(prefix, k) for k in keys)
            sample: dict[str, list[int]] = defaultdict(list)
            ttl_max: dict[str, float] = defaultdict(float)
            without = 0
            for k in keys:
                kind = kind_of(prefix, k)
                ttl = client.pttl(k)
                without += ttl < 0
                ttl_max[kind] = max(ttl_max[kind], ttl / 1000)
                if len(sample[kind]) < 2_000 and ":t" in k:
                    sample[kind].append(int(client.memory_usage(k, samples=0) or 0))
            for kind, n in sorted(kinds.items()):
                sizes = sample[kind]
                mean = sum(sizes) / len(sizes) if sizes else 0
                print(
                    f"key kind {kind!r}: {n:,} keys; MEMORY USAGE of a tenant's {mean:.0f} B "
                    f"(mean of {len(sizes)}); longest TTL {ttl_max[kind]:,.0f} s"
                )
            print(f"keys without an expiry: {without} of {len(keys):,}")

            if args.wait_expiry:
                longest = ttl_max["s"]
                print(f"waiting {longest:.0f} s for the state hashes to expire ...", flush=True)
                expired0 = int(client.info("stats")["expired_keys"])
                time.sleep(longest + 2)  # Redis expires them on its own; nothing scans
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # active expiry samples: let it catch up
                    left = Counter(
                        kind_of(prefix, k)
                        for k in client.scan_iter(match=f"{prefix}*", count=10_000)
                    )
                    if left.get("s", 0) == 0:
                        break
                    time.sleep(1)
                gone = int(client.info("stats")["expired_keys"]) - expired0
                rest = int(client.info("memory")["used_memory"])
                print(
                    f"after the wait: expired_keys +{gone:,}; keys left {dict(left)}; "
                    f"used_memory over the start {(rest - before) / 2**20:.1f} MiB = "
                    f"{(rest - before) / added:.0f} B per tenant (its history hash)"
                )
        finally:
            limiter.close()
            doomed = list(client.scan_iter(match=f"{prefix}*", count=10_000))
            for k in range(0, len(doomed), 1_000):
                client.delete(*doomed[k : k + 1_000])
            client.close()
            print(f"deleted {len(doomed):,} keys; load after: {load()}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
