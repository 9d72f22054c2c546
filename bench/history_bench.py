"""The hot-path cost of each scope's per-minute history, and its size in Redis.

Runs ``RateLoop.call`` (a first-try success, settled from its usage) with
the history on and off, for the memory limiter and the Redis limiter, in one
process and one run, interleaved round by round so that drift and noise
fall on both sides alike; prints the median per-call time of each, and the
overhead.  Then measures what a scope's history takes in Redis: a minute
written by real admissions, settles, a pause and the loop's events
(``MEMORY USAGE``), times the 1,440 minutes kept.

    python bench/history_bench.py [--calls 2000] [--rounds 7] [--redis redis://127.0.0.1:6379/0]

The Redis runs need a reachable Redis (their keys, under a random prefix, are
deleted afterwards).  The machine's other load shows in the numbers: compare
the on/off pairs, not the absolute times, and rerun when they disagree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import httpx

from rateloop import LimitSpec, Policy, RateLoop, Route
from rateloop.admission.limiter import Limiter

ROUTE = Route(provider="openai", model="gpt-5", project="bench")
LIMITS = {
    ROUTE.scope: LimitSpec(
        requests_per_minute=10_000_000, input_tokens_per_minute=10_000_000_000,
        requests_per_day=1_000_000_000,
    )
}  # fmt: skip
REQUEST = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
RESPONSE = httpx.Response(200, json={"usage": {"prompt_tokens": 12}}, request=REQUEST)


def _call(route: Route) -> httpx.Response:
    return RESPONSE


def _loop(url: str, prefix: str, history: bool) -> tuple[RateLoop, Limiter]:
    limiter = Limiter.from_url(url, prefix=prefix, limits=LIMITS, history=history)
    return RateLoop(Policy(), limiter=limiter), limiter


def _per_call(loop: RateLoop, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        loop.call(_call, route=ROUTE)
    return (time.perf_counter() - start) / calls


def run(cases: dict[str, RateLoop], calls: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each case, the cases interleaved within each round."""
    for loop in cases.values():  # warm up: scripts loaded, plans cached
        _per_call(loop, min(200, calls))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds):
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for name in order:
            samples[name].append(_per_call(cases[name], calls))
    return {name: statistics.median(v) for name, v in samples.items()}


def busy_minute(url: str) -> dict[str, str]:
    """The hour hash of a busy minute written by real calls: admissions, settles, a 429 and
    its pause, the event sink's counts (its keys deleted afterwards)."""
    import redis

    from rateloop.admission.backends.keys import history_key
    from rateloop.admission.history import hour_of, minute_of
    from rateloop.observe.redis_events import RedisEventSink
    from rateloop.testing import FaultScript

    prefix = f"rateloop-bench:{uuid.uuid4().hex[:8]}:"
    client = redis.Redis.from_url(url, decode_responses=True)
    limits = {ROUTE.scope: LimitSpec(requests_per_minute=6000, input_tokens_per_minute=6_000_000,
                                     requests_per_day=100_000, concurrency=8)}  # fmt: skip
    limiter = Limiter.from_url(url, prefix=prefix, limits=limits)
    sink = RedisEventSink(url, prefix=prefix)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter,
                    sinks=[sink])  # fmt: skip
    try:
        resp = httpx.Response(429, headers={"retry-after": "0.01"}, request=REQUEST)
        refused = httpx.HTTPStatusError("429", request=REQUEST, response=resp)
        for _ in range(50):
            loop.call(_call, route=ROUTE)
        loop.call(FaultScript([refused, RESPONSE]), route=ROUTE)
        minute = minute_of(float(client.time()[0]))
        keys = [history_key(prefix, ROUTE.scope, hour_of(m)) for m in (minute - 1, minute)]
        return max((client.hgetall(k) for k in keys), key=len)
    finally:
        sink.close()
        limiter.close()
        for k in client.scan_iter(match=f"{prefix}*"):
            client.delete(k)
        client.close()


def day_size(url: str, hour_hash: dict[str, str]) -> tuple[int, int, int, int, str]:
    """A scope busy every minute of a day, as the scripts lay it out, and as the old layout
    (a hash per minute) did: (bytes now, keys now, bytes before, fields per minute, encoding).

    The busy minute's record and counts are copied into all 1,440 minutes (MEMORY USAGE
    summed over the keys); the old layout holds the same record unpacked, one field per name.
    """
    import redis

    from rateloop.admission.history import hour_records

    (minute, record), *_ = [r for r in hour_records(0, hour_hash) if "a" in r[1]]
    at = str(minute % 60)
    mine = {k.partition(":")[2]: v for k, v in hour_hash.items() if k.partition(":")[0] == at}
    prefix = f"rateloop-bench:{uuid.uuid4().hex[:8]}:"
    client = redis.Redis.from_url(url, decode_responses=True)
    first = 29_000_000 // 60 * 60  # an hour's first minute: 24 whole hours
    try:
        pipe = client.pipeline(transaction=False)
        for m in range(first, first + 1440):
            fields = {(f"{m % 60}:{k}" if k else str(m % 60)): v for k, v in mine.items()}
            pipe.hset(f"{prefix}new:{m // 60}", mapping=fields)
            pipe.hset(f"{prefix}old:{m}", mapping=record)
        pipe.execute()
        new = [f"{prefix}new:{h}" for h in range(first // 60, first // 60 + 24)]
        old = [f"{prefix}old:{m}" for m in range(first, first + 1440)]
        now = sum(int(client.memory_usage(k) or 0) for k in new)
        before = sum(int(client.memory_usage(k) or 0) for k in old)
        return now, len(new), before, len(record), str(client.object("encoding", new[0]))
    finally:
        for k in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(k)
        client.close()


def scan_cost(url: str, scopes: int = 100, repeat: int = 5) -> tuple[float, float, int, int]:
    """Seconds of ``RedisStateReader.read()`` (its SCAN) with ``scopes`` scopes x 24 h of history,
    hashes per minute (the old layout) and per hour: (old s, new s, old keys, new keys)."""
    import redis

    from rateloop.admission.backends.keys import key_of
    from rateloop.observe.redis_state import RedisStateReader

    client = redis.Redis.from_url(url)
    out: list[float] = []
    counts: list[int] = []
    try:
        for per in (1, 60):  # minutes per history hash
            prefix = f"rateloop-bench:{uuid.uuid4().hex[:8]}:"
            pipe = client.pipeline(transaction=False)
            n = 0
            for i in range(scopes):
                scope = f"openai:gpt-5:p{i}"
                pipe.hset(key_of(prefix, "s", scope), "p", "0")
                for j in range(1440 // per):
                    pipe.hset(f"{key_of(prefix, 'h', scope)}:{j}", "0", "a 1")
                    n += 1
                pipe.execute()
            reader = RedisStateReader(url, prefix=prefix)
            try:
                assert len(reader.read().scopes) == scopes
                times = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    reader.read()
                    times.append(time.perf_counter() - start)
                out.append(statistics.median(times))
                counts.append(n + scopes)
            finally:
                reader.close()
                for k in client.scan_iter(match=f"{prefix}*", count=1000):
                    client.delete(k)
    finally:
        client.close()
    return out[0], out[1], counts[0], counts[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per case per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--scan", action="store_true", help="only the status/dashboard SCAN, old vs new layout"
    )
    args = parser.parse_args()
    if args.scan:
        old, new, nold, nnew = scan_cost(args.redis)
        print("$ python bench/history_bench.py --scan")
        print(f"100 scopes x 24 h, hash per minute: {nold} keys, read() {old * 1e3:.1f} ms")
        print(f"100 scopes x 24 h, hash per hour:   {nnew} keys, read() {new * 1e3:.1f} ms")
        return
    prefix = f"rateloop-bench:{uuid.uuid4().hex[:8]}:"
    made: list[Limiter] = []

    def case(url: str, history: bool) -> RateLoop:
        loop, limiter = _loop(url, prefix, history)
        made.append(limiter)
        return loop

    cases: dict[str, Callable[[], RateLoop]] = {
        "memory, history off": lambda: case("memory://", False),
        "memory, history on": lambda: case("memory://", True),
        "redis, history off": lambda: case(args.redis, False),
        "redis, history on": lambda: case(args.redis, True),
    }
    built = {name: make() for name, make in cases.items()}
    try:
        medians = run(built, args.calls, args.rounds)
        hour_hash = busy_minute(args.redis)
        size, nkeys, before, fields, encoding = day_size(args.redis, hour_hash)
    finally:
        for limiter in made:
            limiter.close()
        import redis

        client = redis.Redis.from_url(args.redis)
        for k in client.scan_iter(match=f"{prefix}*"):
            client.delete(k)
        client.close()
    print(f"$ python bench/history_bench.py --calls {args.calls} --rounds {args.rounds}")
    print(f"{'case':<22} {'µs/call':>9} {'overhead':>10}")
    for backend in ("memory", "redis"):
        off, on = medians[f"{backend}, history off"], medians[f"{backend}, history on"]
        print(f"{backend + ', history off':<22} {off * 1e6:>9.1f}")
        print(f"{backend + ', history on':<22} {on * 1e6:>9.1f} "
              f"{(on - off) * 1e6:>+7.1f} µs ({(on / off - 1) * 100:+.1f}%)")  # fmt: skip
    print(f"redis, a scope busy every minute of a day ({fields} names a minute, MEMORY USAGE): "
          f"{nkeys} hashes per hour ({encoding}) {size / 1024:.0f} KiB, {size / 1440:.0f} B a "
          f"minute; a hash per minute (before) 1440 keys {before / 1024:.0f} KiB, "
          f"{before / 1440:.0f} B a minute")  # fmt: skip


if __name__ == "__main__":
    main()
