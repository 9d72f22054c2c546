"""Admissions per second: rateloop vs `limits` vs `pyrate-limiter`, memory and Redis, side by side.

Usage::

    python bench/admission_bench.py [--n 20000] [--n-redis 5000] [--repeat 3]
        [--backends memory,redis] [--paths-only] [--redis redis://127.0.0.1:6379/0]
        [--json out.json]

Each case admits ``n`` calls in a tight single-threaded loop with limits so
high that nothing is denied, so the number measured is the cost of one
admission.  "1 dim" limits requests per minute; "3 dims" limits requests,
input tokens and output tokens per minute (rateloop admits the three
atomically in one step; `limits` and `pyrate-limiter` need one hit per
dimension, which is not atomic).  For Redis cases the script also reports
commands sent per admission, from ``INFO commandstats`` deltas (no MONITOR),
so run it against an otherwise idle Redis.

A second table measures rateloop alone on the paths a real loop takes: a
route in three scopes with three dimensions each, the ``Cost`` different on
every call (input tokens cycling through 1000 values), and ``try_reserve``
followed by ``settle`` with a concurrency lease.  ``--paths-only`` skips the
comparison with the other libraries.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from rateloop.admission.limiter import Limiter
from rateloop.admission.spec import LimitSpec
from rateloop.route import Cost, Route

HIGH = 10**9  # a per-minute limit nothing reaches
HUGE = 10**13  # the same for the paths table, whose costs are up to 51k tokens
ROUTE = Route(provider="bench", model="m")
COST = Cost(input_tokens=100, output_tokens=50)
#: The paths table: three scopes, three dimensions each, a cost that varies per call.
ROUTE3 = Route(provider="bench", model="m", project="p", tenant="t")
COSTS = [Cost(input_tokens=1_000 + i, output_tokens=500) for i in range(1_000)]
#: More distinct costs than any plan cache holds: every call is a new estimate.
MANY_COSTS = [Cost(input_tokens=1_000 + i, output_tokens=500) for i in range(50_000)]


@dataclass
class Result:
    name: str
    backend: str
    dims: int
    per_second: float
    round_trips: float | None  # socket writes by the client per admission
    server_commands: float | None  # commands Redis ran per admission, script internals included


class CountingConnection(redis.Connection):
    """A real redis-py connection that counts its writes: one per round trip.

    A pipeline is one write; so is an EVALSHA however much its script does.
    """

    writes = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.writes += 1
        super().send_packed_command(command, check_health)


def commandstats(client: redis.Redis) -> int:
    """Every command Redis executed, including those called inside scripts."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


Case = tuple[str, str, int, Callable[[], object]]  # name, backend, dims, admit


def measure_all(
    cases: list[Case], n: int, rclient: redis.Redis | None, repeat: int
) -> list[Result]:
    """The best of ``repeat`` runs of ``n`` admissions per case, the cases interleaved.

    Each round runs every case once, in a rotated order, so a slow spell of a
    shared machine hits all cases alike instead of whichever ran then; the
    best run counts (as timeit does: noise only slows).
    """
    for _, _, _, admit in cases:
        for _ in range(min(200, n)):  # warm up: connections, script loads, caches
            admit()
    best = [0.0] * len(cases)
    trips: list[float | None] = [None] * len(cases)
    commands: list[float | None] = [None] * len(cases)
    for round_ in range(repeat):
        order = list(range(len(cases)))
        order = order[round_ % len(order) :] + order[: round_ % len(order)]
        for i in order:
            admit = cases[i][3]
            before = commandstats(rclient) if rclient is not None else 0
            writes = CountingConnection.writes
            start = time.perf_counter()
            for _ in range(n):
                admit()
            elapsed = time.perf_counter() - start
            best[i] = max(best[i], n / elapsed)
            if rclient is not None:
                trips[i] = (CountingConnection.writes - writes) / n
                # minus the INFO call made to read the counters
                commands[i] = (commandstats(rclient) - before - 1) / n
    return [
        Result(name, backend, dims, best[i], trips[i], commands[i])
        for i, (name, backend, dims, _) in enumerate(cases)
    ]


# -- rateloop ----------------------------------------------------------------------------------


def rateloop_case(url: str, dims: int, prefix: str) -> Callable[[], object]:
    spec = (
        LimitSpec(requests_per_minute=HIGH)
        if dims == 1
        else LimitSpec(
            requests_per_minute=HIGH, input_tokens_per_minute=HIGH, output_tokens_per_minute=HIGH
        )
    )
    options = {"connection_class": CountingConnection} if url.startswith("redis") else {}
    limiter = Limiter.from_url(url, prefix=prefix, limits={"bench:m": spec}, **options)
    cost = Cost() if dims == 1 else COST

    def admit() -> object:
        r = limiter.try_reserve(ROUTE, cost)
        assert r, r
        return r

    return admit


def path_case(
    url: str, prefix: str, settle: bool, costs: list[Cost] = COSTS
) -> Callable[[], object]:
    """3 scopes × 3 dims, a different Cost each call; with ``settle`` also a lease and a settle."""
    spec = LimitSpec(
        requests_per_minute=HUGE, input_tokens_per_minute=HUGE, output_tokens_per_minute=HUGE
    )
    limits = dict.fromkeys(ROUTE3.scopes, spec)
    if settle:
        limits[ROUTE3.scope] = LimitSpec(
            requests_per_minute=HUGE,
            input_tokens_per_minute=HUGE,
            output_tokens_per_minute=HUGE,
            concurrency=HUGE,
        )
    options = {"connection_class": CountingConnection} if url.startswith("redis") else {}
    limiter = Limiter.from_url(url, prefix=prefix, limits=limits, **options)
    calls = iter(range(10**12))
    size = len(costs)

    def admit() -> object:
        cost = costs[next(calls) % size]
        r = limiter.try_reserve(ROUTE3, cost)
        assert r, r
        return r

    def admit_settle() -> object:
        i = next(calls) % size
        r = limiter.try_reserve(ROUTE3, costs[i])
        assert r, r
        r.settle(900 + i % 1_000, 300)
        return r

    return admit_settle if settle else admit


def path_cases(url: str, prefix: str) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("try_reserve, fixed cost", fixed_path_case(url, f"{prefix}f:")),
        ("try_reserve, cost cycles 1k values", path_case(url, f"{prefix}v:", settle=False)),
        (
            "try_reserve, cost cycles 50k values",
            path_case(url, f"{prefix}w:", settle=False, costs=MANY_COSTS),
        ),
        ("try_reserve+settle, lease, 1k costs", path_case(url, f"{prefix}s:", settle=True)),
        (
            "try_reserve+settle, lease, 50k costs",
            path_case(url, f"{prefix}t:", settle=True, costs=MANY_COSTS),
        ),
    ]


def fixed_path_case(url: str, prefix: str) -> Callable[[], object]:
    """The same three scopes and dimensions with one Cost repeated (the plan-cache best case)."""
    spec = LimitSpec(
        requests_per_minute=HUGE, input_tokens_per_minute=HUGE, output_tokens_per_minute=HUGE
    )
    options = {"connection_class": CountingConnection} if url.startswith("redis") else {}
    limiter = Limiter.from_url(
        url, prefix=prefix, limits=dict.fromkeys(ROUTE3.scopes, spec), **options
    )
    cost = COSTS[0]

    def admit() -> object:
        r = limiter.try_reserve(ROUTE3, cost)
        assert r, r
        return r

    return admit


# -- limits --------------------------------------------------------------------------------------


def limits_case(storage_uri: str, strategy: str, dims: int, prefix: str) -> Callable[[], object]:
    from limits import RateLimitItemPerMinute, storage, strategies

    kwargs: dict[str, Any] = {}
    if storage_uri.startswith("redis"):
        kwargs = {"key_prefix": prefix, "connection_class": CountingConnection}
    store = storage.storage_from_string(storage_uri, **kwargs)
    limiter = {
        "moving": strategies.MovingWindowRateLimiter,
        "fixed": strategies.FixedWindowRateLimiter,
        "sliding": strategies.SlidingWindowCounterRateLimiter,
    }[strategy](store)
    item = RateLimitItemPerMinute(HIGH)
    if dims == 1:
        return lambda: limiter.hit(item, "bench", "requests")

    def admit() -> object:
        ok = limiter.hit(item, "bench", "requests")
        ok = ok and limiter.hit(item, "bench", "input", cost=COST.input_tokens)
        return ok and limiter.hit(item, "bench", "output", cost=COST.output_tokens)

    return admit


# -- pyrate-limiter ------------------------------------------------------------------------------


def pyrate_case(
    kind: str, dims: int, rclient: redis.Redis | None, prefix: str
) -> Callable[[], object]:
    from pyrate_limiter import (
        GCRA,
        Duration,
        InMemoryBucket,
        Rate,
        RedisBucket,
        RedisStateStore,
        StateBucket,
    )
    from pyrate_limiter import (
        Limiter as PyrateLimiter,
    )

    def bucket(key: str) -> Any:
        rates = [Rate(HIGH, Duration.MINUTE)]
        if kind == "memory-log":
            return InMemoryBucket(rates)
        if kind == "memory-gcra":
            return StateBucket(rates, GCRA())
        assert rclient is not None
        if kind == "redis-log":
            return RedisBucket.init(rates, rclient, f"{prefix}{key}")
        return StateBucket(rates, GCRA(), RedisStateStore(rclient, f"{prefix}{key}"))

    names = ["requests"] if dims == 1 else ["requests", "input", "output"]
    weights = {"requests": 1, "input": COST.input_tokens, "output": COST.output_tokens}
    limiters = {n: PyrateLimiter(bucket(n)) for n in names}

    def admit() -> object:
        ok = True
        for name in names:
            ok = ok and bool(limiters[name].try_acquire(name, weight=weights[name], blocking=False))
        return ok

    return admit


def memory_cases(dims: int, prefix: str) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("rateloop", rateloop_case("memory://", dims, prefix)),
        ("limits MovingWindow", limits_case("memory://", "moving", dims, prefix)),
        ("limits FixedWindow", limits_case("memory://", "fixed", dims, prefix)),
        ("limits SlidingWindowCounter", limits_case("memory://", "sliding", dims, prefix)),
        ("pyrate-limiter InMemoryBucket", pyrate_case("memory-log", dims, None, prefix)),
        ("pyrate-limiter GCRA StateBucket", pyrate_case("memory-gcra", dims, None, prefix)),
    ]


def redis_cases(url: str, dims: int, prefix: str) -> list[tuple[str, Callable[[], object]]]:
    pyrate_client = redis.Redis.from_url(url, connection_class=CountingConnection)
    return [
        ("rateloop", rateloop_case(url, dims, f"{prefix}rl{dims}:")),
        ("limits MovingWindow", limits_case(url, "moving", dims, f"{prefix}mw{dims}")),
        ("limits FixedWindow", limits_case(url, "fixed", dims, f"{prefix}fw{dims}")),
        ("limits SlidingWindowCounter", limits_case(url, "sliding", dims, f"{prefix}sw{dims}")),
        (
            "pyrate-limiter RedisBucket",
            pyrate_case("redis-log", dims, pyrate_client, f"{prefix}pl{dims}:"),
        ),
        (
            "pyrate-limiter GCRA RedisStateStore",
            pyrate_case("redis-gcra", dims, pyrate_client, f"{prefix}pg{dims}:"),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20_000, help="admissions per memory case")
    parser.add_argument("--n-redis", type=int, default=5_000, help="admissions per Redis case")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds over the cases; each case's best counts"
    )
    parser.add_argument(
        "--backends",
        default="memory,redis",
        help="comma-separated backends to measure (memory, redis); default both",
    )
    parser.add_argument(
        "--paths-only",
        action="store_true",
        help="only the rateloop paths table (varying cost, reserve+settle)",
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    backends = {b.strip() for b in args.backends.split(",") if b.strip()}
    if not backends or not backends <= {"memory", "redis"}:
        parser.error(f"--backends must name memory and/or redis, got {args.backends!r}")

    prefix = f"rateloop-bench:{uuid.uuid4().hex[:8]}:"
    results: list[Result] = []
    paths: list[Result] = []
    compare = not args.paths_only
    if "memory" in backends:
        for dims in (1, 3) if compare else ():
            cases = [(name, "memory", dims, f) for name, f in memory_cases(dims, prefix)]
            results += measure_all(cases, args.n, None, args.repeat)
        cases = [(name, "memory", 9, f) for name, f in path_cases("memory://", prefix)]
        paths += measure_all(cases, args.n, None, args.repeat)
    if "redis" in backends:
        rclient = redis.Redis.from_url(args.redis)  # for INFO and cleanup: not counted
        try:
            for dims in (1, 3) if compare else ():
                cases = [
                    (name, "redis", dims, f) for name, f in redis_cases(args.redis, dims, prefix)
                ]
                results += measure_all(cases, args.n_redis, rclient, args.repeat)
            cases = [
                (name, "redis", 9, f) for name, f in path_cases(args.redis, f"{prefix}paths:")
            ]
            paths += measure_all(cases, args.n_redis, rclient, args.repeat)
        finally:
            keys = list(rclient.scan_iter(match=f"{prefix}*", count=1000))
            keys += list(rclient.scan_iter(match=f"*{prefix}*", count=1000))
            if keys:
                rclient.delete(*set(keys))
            rclient.close()
    results.sort(key=lambda r: (r.dims, r.backend != "memory"))  # the table's usual order

    if results:
        print(
            f"{'case':38} {'backend':7} {'dims':>4} {'adm/s':>9} {'rateloop/it':>11} "
            f"{'trips/adm':>9} {'cmds/adm':>8}"
        )
    for r in results:
        base = next(
            x
            for x in results
            if x.name == "rateloop" and x.backend == r.backend and x.dims == r.dims
        )
        print(
            f"{r.name:38} {r.backend:7} {r.dims:>4} {r.per_second:>9,.0f} "
            f"{base.per_second / r.per_second:>10.2f}x {_trips(r):>9} {_cmds(r):>8}"
        )
    if results:
        print()
    print(
        f"{'rateloop path (3 scopes x 3 dims)':38} {'backend':7} {'calls/s':>9} "
        f"{'us/call':>8} {'trips/call':>10} {'cmds/call':>9}"
    )
    for r in paths:
        print(
            f"{r.name:38} {r.backend:7} {r.per_second:>9,.0f} {1e6 / r.per_second:>8.2f} "
            f"{_trips(r):>10} {_cmds(r):>9}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([r.__dict__ for r in results + paths], fh, indent=2)


def _trips(r: Result) -> str:
    return f"{r.round_trips:.2f}" if r.round_trips is not None else "-"


def _cmds(r: Result) -> str:
    return f"{r.server_commands:.2f}" if r.server_commands is not None else "-"


if __name__ == "__main__":
    main()
